"""vLLM wire parsing, the only place that knows the request and response shapes: `request`
(what capture adds to a request), `response` (the parser of bodies and stream events, one
interface: `choices_parser` for chat and completions, `responses_parser` for the Responses API,
both registered here), `fastpath` (id arrays parsed from the body bytes), `sse` (event-stream
decoding). Shapes: docs/vllm-wire-format.md."""

from tito_agents._capture.chat.parser import ChoicesParser
from tito_agents._capture.responses.parser import ResponsesParser
from tito_agents._capture.wire.request import RequestInfo, endpoint_for_path, prepare_request
from tito_agents._capture.wire.response import ParsedChoice, ResponseParser, to_ids
from tito_agents._capture.wire.sse import SSEDecoder

__all__ = [
    "ChoicesParser",
    "ParsedChoice",
    "RequestInfo",
    "ResponseParser",
    "ResponsesParser",
    "SSEDecoder",
    "endpoint_for_path",
    "prepare_request",
    "to_ids",
]

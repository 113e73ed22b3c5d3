"""vLLM wire parsing, the only place that knows the request and response shapes: `request`
(what capture adds to a request), `response` (the parser of bodies and stream events), `fastpath`
(id arrays parsed from the body bytes), `sse` (event-stream decoding). Shapes:
docs/vllm-wire-format.md."""

from tito_agents._wire.request import RequestInfo, endpoint_for_path, prepare_request
from tito_agents._wire.response import ParsedChoice, ResponseParser, to_ids
from tito_agents._wire.sse import SSEDecoder

__all__ = [
    "ParsedChoice",
    "RequestInfo",
    "ResponseParser",
    "SSEDecoder",
    "endpoint_for_path",
    "prepare_request",
    "to_ids",
]

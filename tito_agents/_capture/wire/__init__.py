"""vLLM wire handling that every endpoint shares: `request` (`RequestInfo`, which endpoint a path
is, the lax field readers, and `prepare_request`, which dispatches to the endpoint's own request
preparation), `response` (the `ResponseParser` interface of bodies and stream events, and the
caller's copy of a body), `splice` (edits on raw JSON bytes: fields into a request, nulls into
an answer), `fastpath` (id arrays parsed from the body bytes), `sse` (event-stream decoding).

What each endpoint adds and how it reads its answers lives in its folder: `chat/` (chat and
completions), `responses/`, `messages/`; importing this package registers their request
preparations and parsers. Shapes: docs/vllm-wire-format.md."""

from tito_agents._capture.chat.parser import ChoicesParser
from tito_agents._capture.chat.request import prepare_chat
from tito_agents._capture.messages.request import prepare_messages
from tito_agents._capture.responses.parser import ResponsesParser
from tito_agents._capture.responses.request import prepare_responses
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
    "prepare_chat",
    "prepare_messages",
    "prepare_request",
    "prepare_responses",
    "to_ids",
]

"""Responses: one `ResponseParser` per call takes either a whole JSON body or the decoded events of
an SSE stream and yields one `ParsedChoice` per choice with exact id arrays; it also makes the
body the caller gets (the server's bytes, only the fields capture added nulled). Shapes:
docs/vllm-wire-format.md (vLLM 0.32; 0.10.2 and later carry the same id fields).

`ResponseParser(info)` is the parser of the request's endpoint, one interface over two shapes:
`choices_parser.ChoicesParser` (chat and completions: choices keyed by index, prompt ids at the
top or per choice, delta ids per index) and `responses_parser.ResponsesParser` (the Responses API:
one call per response, its ids in the body or the final stream event). Each names its endpoints
when it subclasses `ResponseParser`; importing `tito_agents._capture.wire` registers both."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import orjson

from tito_agents._capture.wire.fastpath import _id_array
from tito_agents._capture.wire.request import RequestInfo
from tito_agents.calls import Endpoint, IdArray, LogprobArray
from tito_agents.errors import CaptureError, MalformedResponseError


@dataclass(slots=True)
class ParsedChoice:
    """The exact ids of one choice, or the reason they cannot be trusted (`error`)."""

    index: int
    prompt_ids: IdArray | None
    sampled_ids: IdArray | None
    logprobs: LogprobArray | None
    finish_reason: str | None
    stop_reason: int | str | None
    routed_experts: str | None = None
    error: CaptureError | None = None
    message: dict[str, Any] | None = None
    """The assistant message (only kept when `RequestInfo.want_message`)."""
    tool_calls: list[dict[str, Any]] | None = None
    """Responses API: the `function_call` output items (`call_id`, `name`, `arguments`, `id`)."""
    reasoning: list[str] | None = None
    """Responses API: the text of each `reasoning` output item."""


def to_ids(value: Any, what: str) -> IdArray:
    """Convert a parsed JSON id list to int32, rejecting anything that is not a JSON integer in
    [0, 2**31): floats, strings, and booleans, which Python and numpy would take as 1 and 0.

    The list is written back as compact JSON and read by `_id_array`, the reader of the cut-out
    arrays of long bodies, so every path has one definition of an id (and this is faster than
    `np.array` on a list of Python ints)."""
    if not isinstance(value, list):
        raise MalformedResponseError(f"{what} is {type(value).__name__}, expected a list of ints")
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:  # an int beyond 64 bits: not an id either
        text = b"[-1]"
    ids = _id_array(memoryview(text)[1:-1])
    if ids is None:
        if all(type(v) is int for v in value):
            raise MalformedResponseError(f"{what} holds ids outside [0, 2**31)")
        raise MalformedResponseError(f"{what} holds values that are not integers")
    return ids


class ResponseParser:
    """Turns one response (a JSON body, or the events of an SSE stream) into `ParsedChoice`s.

    The same object serves both shapes, so stream and non-stream share one set of rules per
    endpoint. `ResponseParser(info)` returns the parser registered for `info.endpoint`.
    `response_id`, `model` and `usage_completion_tokens` are what the response said; `done` is
    set once the response is complete (a body parsed, or a stream's final event absorbed).
    """

    _by_endpoint: ClassVar[dict[Endpoint, type[ResponseParser]]] = {}
    STREAM_END: ClassVar[re.Pattern[bytes]]
    """What a stream chunk that may end the stream holds: the tee decodes at once on it, so the
    call is recorded before that chunk reaches the caller (a mark split across chunks only
    defers the recording to the end of the stream or its close)."""

    def __init_subclass__(cls, *, endpoints: tuple[Endpoint, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for endpoint in endpoints:
            ResponseParser._by_endpoint[endpoint] = cls

    def __new__(cls, info: RequestInfo) -> Self:
        if cls is ResponseParser:  # the interface: the parser of the request's endpoint
            cls = ResponseParser._by_endpoint[info.endpoint]  # type: ignore[assignment]
        return super().__new__(cls)

    def __init__(self, info: RequestInfo) -> None:
        self.info = info
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage_completion_tokens: int | None = None
        self.done = False
        self._payload: dict[str, Any] | None = None
        """The parsed body (after `parse_body`): where `caller_body` finds the added fields."""
        self._body = b""
        """The body `parse_body` was given: the caller's copy is made from its bytes."""

    # ---- non-streaming ----

    def parse_body(self, body: bytes) -> list[ParsedChoice]:
        """Parse a complete JSON response body."""
        raise NotImplementedError

    @property
    def payload(self) -> dict[str, Any] | None:
        """The body `parse_body` parsed (None before, or when it failed). Id arrays the fast path
        cut out are placeholders in it: everything else is the server's JSON."""
        return self._payload

    def caller_body(self) -> bytes | None:
        """The body the caller would have got without capture, or None to pass it on as it came.

        The fields capture added (ids, and logprobs it asked for) are set to null, which is how
        vLLM sends them when not asked, so agents and frameworks never hold thousands of ids per
        response they did not ask for (the openai SDK keeps unknown fields in `model_extra`;
        LangChain keeps logprobs in `response_metadata`). Every other byte is the server's
        (`splice.null_values`): a body parsed and dumped again would turn an echoed integer
        beyond 64 bits into a float, and respell floats and escapes. Only after a successful
        `parse_body`.
        """
        raise NotImplementedError

    # ---- streaming ----

    def feed_payloads(self, payloads: list[bytes]) -> bool:
        """Absorb the decoded SSE data payloads of a stream, in order; True once the stream's end
        is among them (`[DONE]`, or a Responses final event). The loop over a stream's events,
        kept here so one call covers many of them."""
        loads, feed_event = orjson.loads, self.feed_event
        done = False
        for payload in payloads:
            if payload == b"[DONE]":
                done = True  # the server finished: the caller records now
                continue
            try:
                event = loads(payload)
            except orjson.JSONDecodeError as exc:
                raise MalformedResponseError(f"SSE event is not valid JSON: {exc}") from exc
            feed_event(event)
        return done or self.done

    def feed_event(self, event: Any) -> None:
        """Absorb one decoded SSE data payload (a dict). This runs once per streamed token: keep
        it lean."""
        raise NotImplementedError

    def finish_stream(self) -> list[ParsedChoice]:
        """The choices of a stream that ended (with `[DONE]`, a final event, or cleanly without
        either)."""
        raise NotImplementedError

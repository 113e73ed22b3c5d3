"""The pure core of the fake vLLM: configuration, fault switches, stats, and `FakeVLLM.handle`.

`handle` turns one HTTP request into a `FakeResponse` (a body, or an async iterator of SSE events)
without touching a socket; `FakeVLLMServer` (in `_server`) puts it on the network. The public
names are re-exported by `tito_agents.testing.fake_vllm`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tito_agents.testing.fake_vllm import _wire as wire
from tito_agents.testing.fake_vllm._chat import chat
from tito_agents.testing.fake_vllm._codec import TokenCodec, TokenizerLike
from tito_agents.testing.fake_vllm._completions import completions
from tito_agents.testing.fake_vllm._engine import Engine, EngineSettings, Reply, WireFaults
from tito_agents.testing.fake_vllm._messages import count_tokens, messages
from tito_agents.testing.fake_vllm._model import FakeModel, Responder, Tokenization
from tito_agents.testing.fake_vllm._requests import FakeHTTPError, parse_json_object
from tito_agents.testing.fake_vllm._responder import default_responder
from tito_agents.testing.fake_vllm._responses import responses
from tito_agents.testing.smollm2 import EOS_ID, MODEL_NAME, load_tokenizer

__all__ = [
    "FAULT_HEADER",
    "FakeConfig",
    "FakeResponse",
    "FakeStats",
    "FakeVLLM",
    "Faults",
    "StreamCut",
]

FAULT_HEADER = "x-fake-fault"
_log = logging.getLogger(__name__)
_STATUS_TYPES = {
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


@dataclass
class Faults:
    """Fault switches, all off by default. Mutate them at any time; the next request sees them.

    Content faults (what a real but different server would say):

    * `no_token_ids`: behave like vLLM < 0.10.2, which ignores `return_token_ids`: the
      `prompt_token_ids` and `token_ids` keys are absent from bodies and chunks.
    * `include_reasoning_nulls`: the 0.32 gotcha of a server with a tool parser (the project's real
      server has one): a request with `include_reasoning: false` gets `token_ids` and `logprobs`
      as null (prompt ids stay); stream deltas then carry `"reasoning": null` and text-less
      chunks are not sent.
    * `drop_parser_chunks`: pre-0.13 streaming: chunks that release no text (tool-call markup
      swallowed by the parser, partial UTF-8) are not sent even with `return_token_ids`, so their
      `token_ids` are lost.
    * `length_mismatch`: each choice's `token_ids` lose their last id (in streams: on the finish
      chunk) while logprobs and `usage` still count it.

    Transport faults:

    * `cut_stream_after=N`: close the connection after N SSE events, without `data: [DONE]`.
    * `status_before_body=429|500|503`: answer the next `status_before_body_count` requests to
      `/v1/...` with that status and a vLLM error body, before any generation (for client retry
      tests); `retry_after_ms` adds a `retry-after-ms` header (the openai SDK honours it).
    * `latency_ms`: wait before sending each response; `token_latency_ms`: wait before each SSE event.
    * `malformed_json`: a non-stream body (or the second SSE event's JSON) is cut in half.
    * `malformed_sse`: the second SSE event is framed wrongly (`data {...}` without the colon and
      without the blank line), so a compliant SSE parser drops it.

    On `/v1/responses`, `no_token_ids` sends `input_messages` / `output_messages` as null (a
    server older than 0.32 for a non-harmony model), `length_mismatch` drops the last id of
    `output_messages`, and the transport faults apply as on chat (a Responses event keeps its
    `event:` line); `include_reasoning_nulls` and `drop_parser_chunks` do not apply (a Responses
    stream carries its ids only in the final event).
    """

    no_token_ids: bool = False
    include_reasoning_nulls: bool = False
    drop_parser_chunks: bool = False
    length_mismatch: bool = False
    cut_stream_after: int | None = None
    status_before_body: int | None = None
    status_before_body_count: int = 1
    retry_after_ms: int | None = None
    latency_ms: float = 0.0
    token_latency_ms: float = 0.0
    malformed_json: bool = False
    malformed_sse: bool = False

    def wire(self) -> WireFaults:
        return WireFaults(
            no_token_ids=self.no_token_ids,
            include_reasoning_nulls=self.include_reasoning_nulls,
            drop_parser_chunks=self.drop_parser_chunks,
            length_mismatch=self.length_mismatch,
        )

    def overlaid(self, header: str | None) -> tuple[Faults, frozenset[str]]:
        """A copy with the `x-fake-fault` header's settings applied, and the names it set.

        Syntax: comma-separated `name` (a boolean switch turned on) or `name=value`.
        """
        if not header:
            return dataclasses.replace(self), frozenset()
        types = {f.name: f.type for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for item in filter(None, (part.strip() for part in header.split(","))):
            name, _, raw = item.partition("=")
            name = name.strip()
            if name not in types:
                raise FakeHTTPError(
                    400, f"unknown fault {name!r} in {FAULT_HEADER}; known: {sorted(types)}"
                )
            changes[name] = _fault_value(str(types[name]), raw.strip(), name)
        return dataclasses.replace(self, **changes), frozenset(changes)


def _fault_value(kind: str, raw: str, name: str) -> Any:
    try:
        if kind == "bool":
            return raw.lower() not in ("0", "false", "no", "off")
        if "float" in kind:
            return float(raw)
        return int(raw)
    except ValueError as exc:
        raise FakeHTTPError(400, f"bad value {raw!r} for fault {name!r} in {FAULT_HEADER}") from exc


@dataclass
class FakeConfig:
    """Everything a fake server is made of. Defaults model the project's real vLLM 0.32 server.

    `responder` decides what the model says (text, or exact ids); `tokenization` is "canonical"
    (the text's canonical ids) or "drift" (a deterministic `drift_rate` of tokens re-spelled as
    several shorter ones, as real sampling does, so decode -> encode gives other ids). `tokenizer`
    defaults to the SmolLM2 tokenizer with the project's tool template.
    """

    model: str = MODEL_NAME
    max_model_len: int = 8192
    responder: Responder = default_responder
    tokenization: Tokenization = "canonical"
    drift_rate: float = 0.25
    return_tokens_as_token_ids: bool = False
    system_fingerprint: str = "vllm-0.32.0-fa4e5eed"
    faults: Faults = field(default_factory=Faults)
    tokenizer: TokenizerLike | None = None
    eos_id: int = EOS_ID


@dataclass
class FakeStats:
    """What the fake saw: requests per path, responses per status, and broken streams."""

    requests: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    connections: int = 0
    """TCP connections accepted by a `FakeVLLMServer` (keep-alive reuses them)."""
    disconnects: int = 0
    """Streams the client abandoned before the end."""
    cut_streams: int = 0
    """Streams the fake cut on purpose (`cut_stream_after`)."""

    def __getitem__(self, path: str) -> int:
        return self.requests[path]

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def reset(self) -> None:
        self.requests.clear()
        self.statuses.clear()
        self.connections = 0
        self.disconnects = 0
        self.cut_streams = 0


class StreamCut(Exception):
    """Raised by a response stream after `cut_stream_after` events: drop the connection now."""


@dataclass
class FakeResponse:
    """A response of the pure core: a full `body`, or a `stream` of SSE events as bytes.

    `delay_s` is how long a server waits before sending it (`latency_ms`). A stream may end by
    raising `StreamCut`, which a server answers by closing the connection mid-body.
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None
    delay_s: float = 0.0

    @property
    def is_stream(self) -> bool:
        return self.stream is not None

    def json(self) -> Any:
        return orjson.loads(self.body)

    async def read(self) -> bytes:
        """The whole body; for streams, every event (raises `StreamCut` if the stream is cut)."""
        if self.stream is None:
            return self.body
        return b"".join([chunk async for chunk in self.stream])


_codec_lock = threading.Lock()
_codecs: dict[int, TokenCodec] = {}


def _codec_for(tokenizer: TokenizerLike) -> TokenCodec:
    """One codec per tokenizer object: building the byte table takes a moment."""
    with _codec_lock:
        codec = _codecs.get(id(tokenizer))
        if codec is None or codec.tokenizer is not tokenizer:
            codec = _codecs[id(tokenizer)] = TokenCodec(tokenizer)
        return codec


class FakeVLLM:
    """The pure core of the fake server: requests in, `FakeResponse` out, no I/O.

    Thread-safety: `handle` is meant to be called from one thread (the server's); `faults` may be
    changed from any thread.
    """

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.codec = _codec_for(self.config.tokenizer or load_tokenizer())
        model = FakeModel(
            self.codec,
            self.config.responder,
            tokenization=self.config.tokenization,
            drift_rate=self.config.drift_rate,
            eos_id=self.config.eos_id,
        )
        settings = EngineSettings(
            model=self.config.model,
            max_model_len=self.config.max_model_len,
            system_fingerprint=self.config.system_fingerprint,
            return_tokens_as_token_ids=self.config.return_tokens_as_token_ids,
        )
        self.engine = Engine(self.codec, model, settings)
        self.stats = FakeStats()
        self._lock = threading.Lock()

    @property
    def faults(self) -> Faults:
        return self.config.faults

    @property
    def tokenizer(self) -> Any:
        return self.codec.tokenizer

    def fail_next(
        self, count: int = 1, *, status: int = 503, retry_after_ms: int | None = None
    ) -> None:
        """Answer the next `count` `/v1/...` requests with `status` (the `status_before_body` fault)."""
        with self._lock:
            self.faults.status_before_body = status
            self.faults.status_before_body_count = count
            self.faults.retry_after_ms = retry_after_ms

    def handle(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> FakeResponse:
        """Answer one HTTP request. Never raises: failures become vLLM-shaped error responses."""
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        route = path.split("?", 1)[0]
        self.stats.requests[route] += 1
        faults = self.faults
        try:
            faults, overridden = self.faults.overlaid(lowered.get(FAULT_HEADER))
            status = self._injected_status(faults, overridden) if route.startswith("/v1/") else None
            if status is not None:
                response = self._injected_failure(status, faults)
            else:
                response = self._encode(self._route(method.upper(), route, body, faults), faults)
        except FakeHTTPError as exc:
            response = self._error(exc.status, exc.message, exc.err_type, exc.param)
        except Exception as exc:  # a bug in the fake must not kill the server
            _log.exception("fake vLLM failed on %s %s", method, path)
            response = self._error(
                500, f"fake vLLM internal error: {exc!r}", "InternalServerError", None
            )
        response.delay_s = max(faults.latency_ms, 0.0) / 1000
        self.stats.statuses[response.status] += 1
        return response

    # -- routing -------------------------------------------------------------------------------

    def _route(self, method: str, path: str, body: bytes, faults: Faults) -> Reply:
        engine = self.engine
        routes: dict[str, tuple[str, Callable[[], Reply]]] = {
            "/v1/models": ("GET", engine.models),
            "/v1/chat/completions": (
                "POST",
                lambda: chat(engine, parse_json_object(body), faults.wire()),
            ),
            "/v1/completions": (
                "POST",
                lambda: completions(engine, parse_json_object(body), faults.wire()),
            ),
            "/v1/responses": (
                "POST",
                lambda: responses(engine, parse_json_object(body), faults.wire()),
            ),
            "/v1/messages": (
                "POST",
                lambda: messages(engine, parse_json_object(body), faults.wire()),
            ),
            "/v1/messages/count_tokens": (
                "POST",
                lambda: count_tokens(engine, parse_json_object(body)),
            ),
            "/tokenize": ("POST", lambda: engine.tokenize(parse_json_object(body))),
            "/detokenize": ("POST", lambda: engine.detokenize(parse_json_object(body))),
            "/health": ("GET", lambda: Reply(body=None)),
            "/version": ("GET", lambda: Reply(body={"version": "0.32.0"})),
        }
        if path not in routes:
            return Reply(status=404, body={"detail": "Not Found"})
        allowed, answer = routes[path]
        if method != allowed:
            return Reply(status=405, body={"detail": "Method Not Allowed"})
        return answer()

    def _injected_status(self, faults: Faults, overridden: frozenset[str]) -> int | None:
        if "status_before_body" in overridden:
            return faults.status_before_body
        with self._lock:
            shared = self.faults
            if shared.status_before_body is None or shared.status_before_body_count <= 0:
                return None
            shared.status_before_body_count -= 1
            status = shared.status_before_body
            if shared.status_before_body_count == 0:
                shared.status_before_body = None
            return status

    # -- encoding ------------------------------------------------------------------------------

    def _error(self, status: int, message: str, err_type: str, param: str | None) -> FakeResponse:
        body = wire.error_body(message, err_type, param, status)
        return FakeResponse(status, [("content-type", "application/json")], body=body)

    def _injected_failure(self, status: int, faults: Faults) -> FakeResponse:
        err_type = _STATUS_TYPES.get(status, "InternalServerError")
        response = self._error(
            status, f"Injected failure: HTTP {status} from the fake vLLM.", err_type, None
        )
        if faults.retry_after_ms is not None:
            response.headers.append(("retry-after-ms", str(faults.retry_after_ms)))
        return response

    def _encode(self, reply: Reply, faults: Faults) -> FakeResponse:
        if reply.events is None:
            body = b"" if reply.body is None else wire.dumps(reply.body)
            if faults.malformed_json and reply.status == 200 and body:
                body = body[: len(body) // 2]
            headers = [("content-type", "application/json")] if body else []
            return FakeResponse(reply.status, headers + list(reply.headers), body=body)
        if reply.named_events:  # Responses API: `event: <type>` before each `data:` line
            events = [wire.sse_named(e) for e in reply.events]
        else:
            events = [wire.sse(e) if isinstance(e, dict) else wire.DONE for e in reply.events]
        events = _malform(events, faults)
        stream = _paced(events, max(faults.token_latency_ms, 0.0) / 1000, faults.cut_stream_after)
        headers = [("content-type", "text/event-stream; charset=utf-8")]
        return FakeResponse(reply.status, headers + list(reply.headers), stream=stream)


def _malform(events: list[bytes], faults: Faults) -> list[bytes]:
    """Apply `malformed_json` / `malformed_sse` to the second event (the first after the role chunk)."""
    if not (faults.malformed_json or faults.malformed_sse) or not events:
        return events
    events = list(events)
    target = 1 if len(events) > 2 else 0
    name, _, payload = events[target].partition(b"data: ")  # name: a Responses `event:` line
    payload = payload.removesuffix(b"\n\n")
    if faults.malformed_json:
        payload = payload[: max(len(payload) // 2, 1)]
    if faults.malformed_sse:
        events[target] = name + b"data " + payload + b"\n"
    else:
        events[target] = name + b"data: " + payload + b"\n\n"
    return events


async def _paced(
    events: Sequence[bytes], delay_s: float, cut_after: int | None
) -> AsyncIterator[bytes]:
    """Yield SSE events one by one, waiting `delay_s` before each; raise `StreamCut` when cut."""
    for sent, event in enumerate(events):
        if cut_after is not None and sent >= cut_after:
            raise StreamCut(f"stream cut after {cut_after} events")
        if delay_s:
            await asyncio.sleep(delay_s)
        yield event

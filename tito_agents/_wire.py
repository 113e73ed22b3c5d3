"""vLLM wire parsing, the only place that knows the request and response shapes.

Requests: decide whether a request is captured and add `return_token_ids` (and logprobs on demand)
without overriding what the caller set. Responses: one `ResponseParser` takes either a whole JSON
body or the decoded events of an SSE stream, keyed by choice index, and yields one `ParsedChoice`
per choice with exact id arrays. Shapes: docs/vllm-wire-format.md (vLLM 0.32; 0.10.2
and later carry the same id fields).
"""

from __future__ import annotations

import re
import warnings
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from tito_agents.calls import Endpoint, IdArray, LogprobArray
from tito_agents.errors import (
    CaptureError,
    MalformedResponseError,
    MissingTokenIdsError,
    TokenCountMismatchError,
)

_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "logprobs",
    "top_logprobs",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "tool_choice",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
_SAMPLING_SET = frozenset(_SAMPLING_KEYS)
_TOP_ID_KEYS = ("prompt_token_ids",)
_CHOICE_ID_KEYS = ("token_ids", "prompt_token_ids")
"""Where a response carries the ids `return_token_ids` asks for: the fields capture nulls again
for a caller that did not ask for them."""
_MAX_ID = 2**31 - 1
_ABSENT: Any = object()

_NO_IDS_FIX = (
    "use vLLM >= 0.10.2 (it returns ids when a request carries return_token_ids), or do not mark "
    "this host as vLLM if it is another server"
)


# --------------------------------------------------------------------------------------------------
# Requests
#
# `sampling` keeps what a trainer needs to interpret the rollout logprobs: temperature and top-p, the
# logprob settings, and whether decoding was constrained (tool_choice "required"/named, structured
# outputs): vLLM computes logprobs after the grammar mask, so constrained tokens carry the logprob
# of the masked distribution, not of the free model.


@dataclass(slots=True)
class RequestInfo:
    """What the capture layer needs to remember about a request it rewrote."""

    endpoint: Endpoint
    stream: bool
    n: int
    sampling: dict[str, Any]
    wants_logprobs: bool
    messages: list[dict[str, Any]] | None
    tools: list[dict[str, Any]] | None
    include_reasoning: bool = True
    payload: dict[str, Any] | None = None
    """The parsed request body (token-in sessions rewrite it)."""
    want_message: bool = False
    """Keep each choice's assistant message (token-in sessions compare it with the next request)."""
    added_ids: bool = False
    """Capture added `return_token_ids` (the caller did not ask for ids)."""
    added_logprobs: bool = False
    """Capture added `logprobs` (the caller did not ask for them)."""


def endpoint_for_path(path: str) -> Endpoint | None:
    """The endpoint a POST path targets, or None when the path is not one we capture."""
    path = path.rstrip("/")
    if path.endswith("/chat/completions"):
        return Endpoint.CHAT
    if path.endswith("/completions"):
        return Endpoint.COMPLETIONS
    return None


def prepare_request(
    endpoint: Endpoint, body: bytes, *, capture_logprobs: bool
) -> tuple[bytes | None, RequestInfo] | None:
    """Inspect a JSON request body and add the vLLM fields capture needs.

    Returns `(new_body, info)`; `new_body` is None when the body needs no change (the caller already
    asked for ids). Returns None when the request is not captured: not a JSON object, or the caller
    explicitly set `return_token_ids: false`.
    """
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    added_ids = added_logprobs = False
    if "return_token_ids" not in payload:
        payload["return_token_ids"] = True
        added_ids = True
    elif payload["return_token_ids"] is not True:
        return None
    if capture_logprobs and payload.get("logprobs") is None:
        # chat: a boolean; legacy completions: an int top-k count, 0 = only the sampled token
        payload["logprobs"] = True if endpoint is Endpoint.CHAT else 0
        added_logprobs = True
    asked = payload.get("logprobs")
    chat = endpoint is Endpoint.CHAT
    wants_logprobs = asked is True if chat else (type(asked) is int and asked >= 0)
    messages = payload.get("messages") if chat else None
    tools = payload.get("tools")
    info = RequestInfo(
        endpoint=endpoint,
        stream=bool(payload.get("stream")),
        n=int(payload.get("n") or 1),
        # a request has a handful of keys: test those, not every sampling key
        sampling={k: v for k, v in payload.items() if k in _SAMPLING_SET},
        wants_logprobs=wants_logprobs,
        messages=messages if type(messages) is list else None,
        tools=tools if type(tools) is list else None,
        include_reasoning=payload.get("include_reasoning", True) is not False,
        payload=payload,
        added_ids=added_ids,
        added_logprobs=added_logprobs,
    )
    changed = added_ids or added_logprobs
    return (orjson.dumps(payload) if changed else None), info


# --------------------------------------------------------------------------------------------------
# Responses


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


@dataclass(slots=True)
class _ChoiceAccumulator:
    """Per-choice state while a stream arrives: ids and logprobs grow as compact arrays."""

    prompt_ids: IdArray | None = None
    ids: array[int] = field(default_factory=lambda: array("i"))
    logprobs: array[float] = field(default_factory=lambda: array("f"))
    saw_ids: bool = False
    saw_null_ids: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: CaptureError | None = None
    content: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)

    def message(self) -> dict[str, Any]:
        """The assistant message the streamed deltas add up to."""
        calls = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c.get("name"), "arguments": "".join(c.get("arguments", []))},
            }
            for _, c in sorted(self.tool_calls.items())
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if calls:
            message["tool_calls"] = calls
        return message

    def absorb_delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        text = delta.get("content")
        if isinstance(text, str):
            self.content.append(text)
        for call in delta.get("tool_calls") or []:
            slot = self.tool_calls.setdefault(call.get("index", 0), {"arguments": []})
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["name"] = function["name"]
            if function.get("arguments"):
                slot["arguments"].append(function["arguments"])


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


def _chat_logprobs(logprobs: Any, what: str) -> LogprobArray | None:
    if logprobs is None:
        return None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if content is None:
        return None
    try:
        return np.fromiter((e["logprob"] for e in content), dtype=np.float32, count=len(content))
    except (TypeError, KeyError, ValueError) as exc:
        raise MalformedResponseError(f"{what} logprobs are malformed: {exc}") from exc


def _completion_logprobs(logprobs: Any, what: str) -> LogprobArray | None:
    if logprobs is None:
        return None
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if values is None:
        return None
    try:
        return np.array(values, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise MalformedResponseError(f"{what} logprobs are malformed: {exc}") from exc


def _missing_ids_error(info: RequestInfo, has_prompt: bool, index: int) -> MissingTokenIdsError:
    if has_prompt and not info.include_reasoning:
        return MissingTokenIdsError(
            f"choice {index}: vLLM returned prompt ids but null token_ids because the request set "
            "include_reasoning=false while the server runs a tool or reasoning parser (vLLM 0.32).",
            fix="do not send include_reasoning=false to a vLLM server used for RL rollouts",
        )
    if has_prompt:
        return MissingTokenIdsError(
            f"choice {index}: the response has prompt_token_ids but no token_ids.",
            fix=_NO_IDS_FIX,
        )
    return MissingTokenIdsError(
        f"choice {index}: the response has no prompt_token_ids/token_ids although "
        "return_token_ids was sent; the server ignored it.",
        fix=_NO_IDS_FIX,
    )


def _check_logprobs(choice: ParsedChoice, info: RequestInfo) -> None:
    """Logprobs, when requested, must cover every sampled id exactly once."""
    if choice.error is not None or choice.sampled_ids is None:
        return
    if choice.logprobs is None:
        if info.wants_logprobs and choice.sampled_ids.shape[0] > 0:
            choice.error = TokenCountMismatchError(
                f"choice {choice.index}: logprobs were requested but the response has none."
            )
        return
    if choice.logprobs.shape[0] != choice.sampled_ids.shape[0]:
        choice.error = TokenCountMismatchError(
            f"choice {choice.index}: {choice.logprobs.shape[0]} logprobs for "
            f"{choice.sampled_ids.shape[0]} sampled ids."
        )


class ResponseParser:
    """Turns one response (a JSON body, or the events of an SSE stream) into `ParsedChoice`s.

    The same object serves both shapes, so chat, completions, stream and non-stream share one set of
    rules: ids by `choices[i].index`, prompt ids top-level (chat) or per choice (completions), delta
    ids concatenated per index, usage checked when present.
    """

    def __init__(self, info: RequestInfo) -> None:
        self.info = info
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage_completion_tokens: int | None = None
        self.done = False
        self._choices: dict[int, _ChoiceAccumulator] = {}
        self._segments: _BodySegments | None = None
        self._payload: dict[str, Any] | None = None
        # read once per stream event: kept as plain attributes
        self._chat = info.endpoint is Endpoint.CHAT
        self._logprobs = info.wants_logprobs
        self._message = info.want_message

    # ---- non-streaming ----

    def parse_body(self, body: bytes) -> list[ParsedChoice]:
        """Parse a complete JSON response body.

        The long arrays (prompt ids, sampled ids, logprob entries) are cut out of the body and
        parsed as arrays; only the small rest goes through the JSON parser. A body whose layout is
        unexpected falls back to parsing it whole, which also produces the precise error.
        """
        segments = _BodySegments.split(body)
        try:
            payload = orjson.loads(segments.skeleton if segments else body)
        except orjson.JSONDecodeError as exc:
            if segments is not None:
                return self._parse_whole(body)
            raise MalformedResponseError(f"response body is not valid JSON: {exc}") from exc
        self._segments = segments
        try:
            return self._parse_payload(payload)
        except _FallBack:
            return self._parse_whole(body)

    def _parse_whole(self, body: bytes) -> list[ParsedChoice]:
        self._segments = None
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise MalformedResponseError(f"response body is not valid JSON: {exc}") from exc
        return self._parse_payload(payload)

    def _ids(self, value: Any, what: str) -> IdArray:
        if self._segments is not None and isinstance(value, str):
            return self._segments.ids(value)
        return to_ids(value, what)

    def _parse_payload(self, payload: Any) -> list[ParsedChoice]:
        if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
            raise MalformedResponseError("response body has no choices list")
        self.response_id = payload.get("id")
        self.model = payload.get("model")
        chat = self.info.endpoint is Endpoint.CHAT
        top_prompt: IdArray | None = None
        top_raw = payload.get("prompt_token_ids")
        if chat and top_raw is not None:
            top_prompt = self._ids(top_raw, "prompt_token_ids")
        parsed: list[ParsedChoice] = []
        for raw in payload["choices"]:
            parsed.append(self._parse_body_choice(raw, top_prompt))
        usage = payload.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_completion_tokens = usage["completion_tokens"]
            self._check_usage(parsed)
        self.done = True
        self._payload = payload
        return parsed

    def caller_body(self) -> bytes | None:
        """The body the caller would have got without capture, or None to pass it on as it came.

        The fields capture added (ids, and logprobs it asked for) are set to null, which is how
        vLLM sends them when not asked, so agents and frameworks never hold thousands of ids per
        response they did not ask for (the openai SDK keeps unknown fields in `model_extra`;
        LangChain keeps logprobs in `response_metadata`). Only after a successful `parse_body`.
        """
        info, payload = self.info, self._payload
        if payload is None or not (info.added_ids or info.added_logprobs):
            return None
        segments = self._segments
        if segments is not None and not info.added_logprobs:
            nulled = self._added_id_arrays(segments, payload)
            if nulled is not None:  # the server's own bytes, each added id array now `null`
                return segments.join(nulled)
        for key in _TOP_ID_KEYS if info.added_ids else ():
            if key in payload:
                payload[key] = None
        for choice in payload["choices"]:
            if info.added_ids:
                for key in _CHOICE_ID_KEYS:
                    if key in choice:
                        choice[key] = None
            if info.added_logprobs and "logprobs" in choice:
                choice["logprobs"] = None
        out = orjson.dumps(payload)
        if segments is not None:  # arrays the caller asked for: put their text back
            out = segments.restore(out)
        return out

    @staticmethod
    def _added_id_arrays(segments: _BodySegments, payload: dict[str, Any]) -> set[int] | None:
        """The cut-out arrays at the id fields capture added; None when one of those fields holds
        anything but a cut-out array or null, which the general path then sets to null."""
        nulled: set[int] = set()
        holders: list[Any] = [payload, *payload["choices"]]
        for i, holder in enumerate(holders):
            if not isinstance(holder, dict):
                return None
            for key in _TOP_ID_KEYS if i == 0 else _CHOICE_ID_KEYS:
                value = holder.get(key)
                if value is None:
                    continue
                index = segments.index_of(value)
                if index is None:
                    return None
                nulled.add(index)
        return nulled

    def _parse_body_choice(self, raw: Any, top_prompt: IdArray | None) -> ParsedChoice:
        if not isinstance(raw, dict):
            raise MalformedResponseError("a choice is not an object")
        index = raw.get("index", 0)
        choice = ParsedChoice(
            index=index,
            prompt_ids=None,
            sampled_ids=None,
            logprobs=None,
            finish_reason=raw.get("finish_reason"),
            stop_reason=raw.get("stop_reason"),
            routed_experts=raw.get("routed_experts"),
        )
        if self.info.want_message and isinstance(raw.get("message"), dict):
            choice.message = raw["message"]
        try:
            chat = self.info.endpoint is Endpoint.CHAT
            if chat:
                choice.prompt_ids = top_prompt
            elif raw.get("prompt_token_ids") is not None:
                choice.prompt_ids = self._ids(raw["prompt_token_ids"], "prompt_token_ids")
            if raw.get("token_ids") is not None:
                choice.sampled_ids = self._ids(raw["token_ids"], "token_ids")
            if choice.prompt_ids is None or choice.sampled_ids is None:
                choice.error = _missing_ids_error(self.info, choice.prompt_ids is not None, index)
                return choice
            what = f"choice {index}"
            lp = raw.get("logprobs") if self.info.wants_logprobs else None
            if lp is None:
                pass  # not asked for: entries a caller did not request are not parsed
            elif chat:
                segments = self._segments
                content = lp.get("content") if isinstance(lp, dict) else None
                if segments is not None and isinstance(content, str):
                    choice.logprobs = segments.logprobs(content)
                else:
                    choice.logprobs = _chat_logprobs(lp, what)
            else:
                choice.logprobs = _completion_logprobs(lp, what)
            _check_logprobs(choice, self.info)
        except CaptureError as exc:
            choice.error = exc
        return choice

    # ---- streaming ----

    def feed_event(self, event: Any) -> None:
        """Absorb one decoded SSE data payload (a dict). This runs once per streamed token: keep it
        lean."""
        if type(event) is not dict:
            raise MalformedResponseError("SSE event is not a JSON object")
        if self.response_id is None:
            self.response_id = event.get("id")
            self.model = event.get("model")
        choices = event.get("choices")
        if not choices:
            if "error" in event:
                raise MalformedResponseError(f"stream carried an error event: {event['error']}")
            usage = event.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                self.usage_completion_tokens = usage["completion_tokens"]
            return
        for raw in choices:
            index = raw.get("index", 0)
            acc = self._choices.get(index)
            if acc is None:
                acc = self._choices[index] = _ChoiceAccumulator()
            if acc.error is not None:
                continue
            try:
                self._feed_choice(acc, raw, event)
            except CaptureError as exc:
                acc.error = exc
            except (TypeError, KeyError, ValueError, AttributeError, OverflowError) as exc:
                acc.error = MalformedResponseError(f"choice {index}: malformed stream chunk: {exc}")

    def _feed_choice(self, acc: _ChoiceAccumulator, raw: dict[str, Any], event: Any) -> None:
        if acc.prompt_ids is None:  # chat: on the event; completions: on the choice
            prompt_raw = (event if self._chat else raw).get("prompt_token_ids")
            if prompt_raw is not None:
                acc.prompt_ids = to_ids(prompt_raw, "prompt_token_ids")
        ids = raw.get("token_ids", _ABSENT)
        if ids is None:
            acc.saw_null_ids = True
        elif ids is not _ABSENT:
            if type(ids) is not list:
                raise MalformedResponseError("streamed token_ids is not a list")
            # array("i") takes True and False as 1 and 0: `in` compares by value, so ids 1 and 0
            # also get here, where the types are looked at
            if (True in ids or False in ids) and bool in map(type, ids):
                raise MalformedResponseError("streamed token_ids hold booleans, not integers")
            # array("i") refuses non-integers (TypeError) and ids >= 2**31 (OverflowError);
            # negative ids are looked for once, in finish_stream
            acc.ids.extend(ids)
            acc.saw_ids = True
            if self._logprobs:
                lp = raw.get("logprobs")
                if lp is not None:
                    if self._chat:
                        content = lp["content"]
                        if content is not None:
                            acc.logprobs.extend([e["logprob"] for e in content])
                    else:
                        values = lp["token_logprobs"]
                        if values is not None:
                            acc.logprobs.extend(values)
        if self._message:
            acc.absorb_delta(raw.get("delta"))
        finish = raw.get("finish_reason")
        if finish is not None:
            acc.finish_reason = finish
            acc.stop_reason = raw.get("stop_reason")

    def finish_stream(self) -> list[ParsedChoice]:
        """The choices of a stream that ended with `[DONE]` (or cleanly without it)."""
        parsed: list[ParsedChoice] = []
        for index in sorted(self._choices):
            acc = self._choices[index]
            choice = ParsedChoice(
                index=index,
                prompt_ids=acc.prompt_ids,
                sampled_ids=None,
                logprobs=None,
                finish_reason=acc.finish_reason,
                stop_reason=acc.stop_reason,
                error=acc.error,
                message=acc.message() if self.info.want_message else None,
            )
            if choice.error is None:
                if acc.prompt_ids is None or not acc.saw_ids or acc.saw_null_ids:
                    choice.error = _missing_ids_error(self.info, acc.prompt_ids is not None, index)
                elif acc.ids and min(acc.ids) < 0:
                    choice.error = MalformedResponseError(
                        f"choice {index}: streamed token_ids hold negative values"
                    )
                else:
                    choice.sampled_ids = np.frombuffer(acc.ids, dtype=np.int32)
                    if acc.logprobs:
                        choice.logprobs = np.frombuffer(acc.logprobs, dtype=np.float32)
                    _check_logprobs(choice, self.info)
            parsed.append(choice)
        self._check_usage(parsed)
        return parsed

    def _check_usage(self, parsed: list[ParsedChoice]) -> None:
        """`usage.completion_tokens` counts every sampled id over all choices (EOS included)."""
        expected = self.usage_completion_tokens
        if expected is None or any(c.sampled_ids is None for c in parsed):
            return
        got = sum(int(c.sampled_ids.shape[0]) for c in parsed if c.sampled_ids is not None)
        if got != expected:
            for c in parsed:
                if c.error is None:
                    c.error = TokenCountMismatchError(
                        f"choice {c.index}: {got} token ids over all choices but "
                        f"usage.completion_tokens is {expected} (ids were lost in the stream; "
                        "vLLM < 0.13 drops chunks swallowed by tool/reasoning parsers).",
                        fix="use vLLM >= 0.13 for streaming with parsers, or call without stream",
                    )


class _FallBack(Exception):
    """A cut-out segment did not parse on the fast path: parse the body whole instead."""


_ID_KEY = b'token_ids":['
_CONTENT_KEY = b'"logprobs":{"content":['
_CONTENT_END = b']},"finish_reason":'
_MARK = "\x00tito:"
_NUL = b"\\u0000"
"""How NUL, which starts every marker, appears in JSON text (a raw NUL byte is invalid JSON)."""


def _marker(i: int) -> bytes:
    """The JSON string standing in for cut-out array `i` (it decodes to `_MARK` + i)."""
    return b'"\\u0000tito:%d"' % i


_DIGITS = b"0123456789,"
_DIGIT_BYTES = frozenset(b"0123456789")
_LEADING_ZERO = re.compile(rb",0[0-9]")


def _fromstring_raises() -> bool:
    """Whether this numpy raises on text it cannot read to the end (newer numpy) rather than
    warning (older numpy, where the warning must be turned into an error around each parse)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            np.fromstring(b"1,,2", dtype=np.int64, sep=",")
        except ValueError:
            return True
    return False


_FROMSTRING_RAISES = _fromstring_raises()

try:  # the optional C helper (tito_agents/_speedups.c, built at install when a compiler exists)
    from tito_agents import _speedups
except ImportError:  # pragma: no cover - depends on the install
    _speedups = None  # type: ignore[assignment]


def _id_array(text: bytes | memoryview) -> IdArray | None:
    """The ids of the text between the brackets of a JSON id list, or None when it is not only
    JSON integers in [0, 2**31) (a float, a string, `true`, a sign...).

    With the C helper: one pass (JSON whitespace allowed). Without it, numpy's text parser on
    compact JSON only (what vLLM sends: digits and single commas), since numpy reads "1, ,2" as
    [1, 0, 2]."""
    if _speedups is not None:  # one pass in C: validation and values
        parsed = _speedups.parse_ids(text)
        return None if parsed is None else np.frombuffer(parsed, dtype=np.int32)
    text = bytes(text)
    if not text:
        return np.zeros(0, dtype=np.int32)
    if text.translate(None, _DIGITS) or text[0] not in _DIGIT_BYTES or text[-1] not in _DIGIT_BYTES:
        return None
    if (text[0] == 48 and text[1:2].isdigit()) or (b",0" in text and _LEADING_ZERO.search(text)):
        return None  # "01" is not JSON (numpy reads it as 1; the C helper refuses it too)
    try:  # an empty item (",,") is text numpy cannot read to the end: ValueError
        values = _parse_int_text(text)
    except ValueError:
        return None
    if values.max() > _MAX_ID:  # numpy saturates at 2**63 - 1, so this sees every overflow
        return None
    return values.astype(np.int32)


def _parse_int_text(segment: bytes) -> npt.NDArray[np.int64]:
    """`np.fromstring` of comma-separated ints; raises ValueError on text it cannot read whole."""
    if _FROMSTRING_RAISES:
        return np.fromstring(segment, dtype=np.int64, sep=",")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return np.fromstring(segment, dtype=np.int64, sep=",")
        except DeprecationWarning as exc:
            raise ValueError(str(exc)) from None


class _BodySegments:
    """A JSON body with its long arrays cut out and replaced by marker strings.

    `token_ids` arrays become int32 arrays through `_id_array`, so the JSON parser builds no
    Python int per token; chat logprob entries are parsed on their own, only when present. The cut
    points are found by byte search: the keys contain quotes, which cannot occur unescaped inside a
    string. The cut-out arrays are views of the body, not copies.

    A marker is a JSON string starting with NUL. The server's text can only hold NUL as the escape
    `\\u0000`; a body with one anywhere outside the cut-out arrays is not split (it parses whole),
    so no string a server sends, as a value or a key, can be taken for a marker, and no marker text
    can be found in the server's own strings when `restore` puts the arrays back.
    """

    __slots__ = ("_pieces", "_raw", "skeleton")

    def __init__(self, pieces: list[bytes], raw: list[memoryview]) -> None:
        self._pieces = pieces
        """The body between the cut-out arrays (one more piece than arrays)."""
        self._raw = raw
        parts = [pieces[0]]
        for i in range(len(raw)):
            parts += (_marker(i), pieces[i + 1])
        self.skeleton = b"".join(parts)

    @classmethod
    def split(cls, body: bytes) -> _BodySegments | None:
        """Cut the id arrays, and the chat logprob entries before them, out of `body`."""
        if len(body) < 2048:
            return None  # small bodies parse whole just as fast
        view = memoryview(body)
        pieces: list[bytes] = []
        raw: list[memoryview] = []
        pos = 0
        key = body.find(_ID_KEY)
        while key != -1:
            # vLLM writes a choice's logprobs before its token_ids, so entries are only looked for
            # between the last cut and the next ids: each byte is searched once
            content = body.find(_CONTENT_KEY, pos, key)
            if content != -1:
                start = content + len(_CONTENT_KEY)
                end = body.find(_CONTENT_END, start, key)
                if end == -1:
                    return None
                close = end + 1  # keep "}" of the logprobs object
            else:
                start = key + len(_ID_KEY)
                end = body.find(b"]", start)
                if end == -1:
                    return None
                close = end + 1
                key = body.find(_ID_KEY, close)
            pieces.append(body[pos : start - 1])
            raw.append(view[start:end])
            pos = close
        if not raw:
            return None
        pieces.append(body[pos:])
        if any(_NUL in piece for piece in pieces):
            # a string of the server's may hold NUL (JSON writes it only as \u0000), so it could
            # equal a marker: no markers then. Otherwise every string the skeleton parses to that
            # starts with `_MARK` is a marker this split put exactly where its array was cut out.
            return None
        return cls(pieces, raw)

    def join(self, nulled: set[int]) -> bytes:
        """The body again, byte for byte, except that the cut-out arrays `nulled` are `null`."""
        pieces, raw = self._pieces, self._raw
        parts: list[bytes | memoryview] = [pieces[0]]
        for i, segment in enumerate(raw):
            if i in nulled:
                parts.append(b"null")
            else:
                parts += (b"[", segment, b"]")
            parts.append(pieces[i + 1])
        return b"".join(parts)

    def restore(self, dumped: bytes) -> bytes:
        """`dumped` (the skeleton, edited and serialized again) with every marker still in it
        replaced by the array it stands for."""
        for i, raw in enumerate(self._raw):
            marker = _marker(i)
            if marker in dumped:
                dumped = dumped.replace(marker, b"[" + raw + b"]")
        return dumped

    def index_of(self, value: Any) -> int | None:
        """Which cut-out array a parsed skeleton value stands for, or None if it is no marker."""
        if type(value) is not str or not value.startswith(_MARK):
            return None
        digits = value[len(_MARK) :]
        if not digits.isdigit() or int(digits) >= len(self._raw):
            return None
        return int(digits)

    def _segment(self, marker: str) -> memoryview:
        index = self.index_of(marker)
        if index is None:
            raise MalformedResponseError("token ids are a string, expected a list of ints")
        return self._raw[index]

    def ids(self, marker: str) -> IdArray:
        """The ids of a cut-out array; `_FallBack` when the text is not plain JSON integers in
        [0, 2**31), so the full parser accepts valid JSON and names the problem in the rest."""
        ids = _id_array(self._segment(marker))
        if ids is None:
            raise _FallBack
        return ids

    def logprobs(self, marker: str) -> LogprobArray:
        segment = self._segment(marker)
        try:
            content = orjson.loads(b"[" + segment + b"]")
        except orjson.JSONDecodeError:
            raise _FallBack from None
        return _chat_logprobs({"content": content}, "logprobs")  # type: ignore[return-value]


_BOM = b"\xef\xbb\xbf"
_START, _AFTER_CR = 1, 2
"""`SSEDecoder` states besides the usual 0: the stream's first bytes (a BOM may begin them), and
just after a chunk that ended with CR (an LF starting the next chunk ends the same line)."""


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes in, `data:` payloads out, as the WHATWG event
    stream interpretation reads them, whatever the chunk boundaries.

    Lines end with LF, CRLF or a bare CR; a CR that ends one chunk and an LF that starts the next
    are one line end (so the event is complete at the CR, as an eager client like the openai SDK
    sees it, and the LF is not a second, event-ending, blank line). Comment lines and other fields
    (`event:`, `id:`) are skipped, several `data:` lines join with LF, one leading BOM is dropped.
    `[DONE]` is reported as the payload b"[DONE]".

    Line ends are normalized to LF as bytes arrive, so events split on b"\n\n" in one C call per
    chunk; a chunk with no CR (what vLLM sends) takes no extra pass.
    """

    __slots__ = ("_buffer", "_state")

    def __init__(self) -> None:
        self._buffer = b""
        self._state = _START

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the data payloads of every event completed by them."""
        if self._state:
            data = self._edge(data)
        if b"\r" in data:
            if data[-1:] == b"\r":
                self._state = _AFTER_CR
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + data if self._buffer else data
        *events, self._buffer = buffer.split(b"\n\n")  # one C call for a chunk of many events
        out: list[bytes] = []
        for event in events:
            if event[:6] == b"data: " and b"\n" not in event:
                out.append(event[6:])  # the usual event: one "data: " line
            elif event:
                payload = _event_data(event)
                if payload is not None:
                    out.append(payload)
        return out

    def _edge(self, data: bytes) -> bytes:
        """`data` without what belongs to the state: a leading BOM, or the LF of a CRLF whose CR
        ended the previous chunk. Rare, so kept off the per-chunk path."""
        if self._state == _AFTER_CR:
            if not data:
                return data  # an empty read: the next byte may still be that LF
            self._state = 0
            return data[1:] if data[:1] == b"\n" else data
        head = self._buffer + data  # the stream's first bytes, fewer than 3 so far
        if len(head) < 3 and _BOM.startswith(head):
            self._buffer = head  # too short to know whether a BOM begins the stream
            return b""
        self._state, self._buffer = 0, b""
        return head[3:] if head.startswith(_BOM) else head

    def flush(self, *, complete_lines: bool = False) -> list[bytes]:
        """The payload of the event left pending, as if a blank line followed.

        At the end of the body (default) its last line counts even without a line end (lenient: a
        server may omit the final newline). When the caller closes the stream early
        (`complete_lines`), only lines whose end arrived count: a client that reads lines, such as
        one that stops at the line `data: [DONE]`, may close before the blank line that follows."""
        rest, self._buffer = self._buffer, b""
        if self._state == _START:
            self._state = 0
            rest = rest.removeprefix(_BOM)  # the partial BOM itself cannot end a line
        if complete_lines:
            rest = rest[: rest.rfind(b"\n") + 1]
        payload = _event_data(rest) if rest else None
        return [payload] if payload is not None else []


def _event_data(event: bytes) -> bytes | None:
    """The data of one event (its lines, LF-separated), or None when it has no `data` field.

    A line is a field `name:value` (one space after the colon is dropped) or a bare `name`; only
    `data` fields count; lines starting with ":" are comments."""
    data: bytes | None = None
    for line in event.split(b"\n"):
        if line[:5] == b"data:":
            value = line[6:] if line[5:6] == b" " else line[5:]
        elif line == b"data":
            value = b""
        else:
            continue
        data = value if data is None else data + b"\n" + value
    return data

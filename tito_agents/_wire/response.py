"""Responses: one `ResponseParser` per call takes either a whole JSON body or the decoded events of
an SSE stream, keyed by choice index, and yields one `ParsedChoice` per choice with exact id
arrays; it also rebuilds the body the caller gets (only the fields capture added are nulled).
Shapes: docs/vllm-wire-format.md (vLLM 0.32; 0.10.2 and later carry the same id fields)."""

from __future__ import annotations

import operator
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tito_agents._wire.fastpath import _BodySegments, _FallBack, _id_array
from tito_agents._wire.request import RequestInfo
from tito_agents._wire.responses_chat import assistant_message
from tito_agents.calls import Endpoint, IdArray, LogprobArray
from tito_agents.errors import (
    CaptureError,
    MalformedResponseError,
    MissingTokenIdsError,
    TokenCountMismatchError,
)

_TOP_ID_KEYS = ("prompt_token_ids",)
_CHOICE_ID_KEYS = ("token_ids", "prompt_token_ids")
"""Where a response carries the ids `return_token_ids` asks for: the fields capture nulls again
for a caller that did not ask for them."""
_ABSENT: Any = object()
_LOGPROB = operator.itemgetter("logprob")

_NO_IDS_FIX = (
    "use vLLM >= 0.10.2 (it returns ids when a request carries return_token_ids), or do not mark "
    "this host as vLLM if it is another server"
)


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
    tool_calls: list[dict[str, Any]] | None = None
    """Responses API: the `function_call` output items (`call_id`, `name`, `arguments`, `id`)."""
    reasoning: list[str] | None = None
    """Responses API: the text of each `reasoning` output item."""


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
        self._responses = info.endpoint is Endpoint.RESPONSES
        self._final: list[ParsedChoice] | None = None
        """Responses stream: the choice parsed from its final event."""

    # ---- non-streaming ----

    def parse_body(self, body: bytes) -> list[ParsedChoice]:
        """Parse a complete JSON response body.

        The long arrays (prompt ids, sampled ids, logprob entries) are cut out of the body and
        parsed as arrays; only the small rest goes through the JSON parser. A body whose layout is
        unexpected falls back to parsing it whole, which also produces the precise error.
        """
        if self._responses:
            return self._parse_whole(body)  # the Responses shape has no cut-out arrays (yet)
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
        if self._responses:
            one = [parse_responses_body(payload, self.info)]
            self.response_id = payload.get("id")
            self.model = payload.get("model")
            self.done = True
            self._payload = payload
            return one
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
        if self._responses:
            return orjson.dumps(responses_caller_view(payload, info))
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
                    entries = {"content": segments.logprob_entries(content)}
                    choice.logprobs = _chat_logprobs(entries, "logprobs")
                else:
                    choice.logprobs = _chat_logprobs(lp, what)
            else:
                choice.logprobs = _completion_logprobs(lp, what)
            _check_logprobs(choice, self.info)
        except CaptureError as exc:
            choice.error = exc
        return choice

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
        """Absorb one decoded SSE data payload (a dict). This runs once per streamed token: keep it
        lean."""
        if type(event) is not dict:
            raise MalformedResponseError("SSE event is not a JSON object")
        if self._responses:
            self._feed_responses_event(event)
            return
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
                            acc.logprobs.extend(map(_LOGPROB, content))
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

    def _feed_responses_event(self, event: dict[str, Any]) -> None:
        """A Responses stream event: only the final one (`response.completed`, or
        `response.incomplete` / `response.failed`) carries the ids; `error` fails the call."""
        kind = event.get("type")
        if kind in _RESPONSES_FINAL:
            response = event.get("response")
            if not isinstance(response, dict):
                raise MalformedResponseError(f"the {kind} event has no response object")
            self.response_id = response.get("id") or self.response_id
            self.model = response.get("model") or self.model
            self._final = [parse_responses_body(response, self.info)]
            self.done = True
        elif kind == "error":
            raise MalformedResponseError(f"stream carried an error event: {event}")
        elif self.response_id is None and isinstance(event.get("response"), dict):
            self.response_id = event["response"].get("id")
            self.model = event["response"].get("model")

    def finish_stream(self) -> list[ParsedChoice]:
        """The choices of a stream that ended with `[DONE]` (or cleanly without it); a Responses
        stream's one choice, from its final event (none when that event never came)."""
        if self._responses:
            return list(self._final or ())
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


# --------------------------------------------------------------------------------------------------
# Responses API bodies (vLLM 0.32, `enable_response_messages: true`)
#
# One response is one call (choice index 0): `input_messages[0].tokens` is the prompt the engine
# saw, `output_messages[0].tokens` what it sampled (EOS included). The output items say what the
# parsers made of them: `message` (text, with per-token logprobs when asked), `function_call`,
# `reasoning`. vLLM gives logprobs only for output text: tokens its parsers turn into function
# calls or reasoning carry none, so such a call keeps exact ids and no logprobs. In a stream the
# entries are per text delta (the EOS has none): unless they cover every id, the call has none.

_RESPONSES_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_RESPONSE_ID_KEYS = ("input_messages", "output_messages")

_NO_MESSAGES_FIX = (
    "use vLLM >= 0.32 for the Responses API (earlier versions return input_messages/"
    "output_messages only for gpt-oss models, and never in streams), call the chat completions "
    "endpoint instead, or do not mark this host as vLLM if it is another server"
)


def _engine_tokens(payload: dict[str, Any], key: str) -> IdArray | None:
    """The token ids of `input_messages` / `output_messages`: None when the field is absent or
    null (the server ignored `enable_response_messages`)."""
    entries = payload.get(key)
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise MalformedResponseError(f"{key} is {type(entries).__name__}, expected a list")
    if len(entries) != 1:
        # several engine turns in one response (a server-side tool loop) are not one call
        raise MalformedResponseError(
            f"{key} holds {len(entries)} entries; capture expects one engine turn per response",
            fix="run tools on the client side (function tools), one response per model turn",
        )
    entry = entries[0]
    if not isinstance(entry, dict) or "tokens" not in entry:
        raise MissingTokenIdsError(
            f"{key}[0] carries no tokens (harmony message objects hold no token ids).",
            fix="use the chat completions endpoint for harmony (gpt-oss) models",
        )
    return to_ids(entry["tokens"], f"{key}[0].tokens")


def _responses_finish(payload: dict[str, Any], tool_calls: list[dict[str, Any]] | None) -> str:
    """The chat-style finish reason of a response: "length" when `max_output_tokens` cut it,
    "tool_calls" when it made function calls, "stop" otherwise (or the incomplete reason)."""
    status = payload.get("status")
    if status == "incomplete":
        details = payload.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason in (None, "max_output_tokens") else str(reason)
    if status != "completed":
        return str(status)
    return "tool_calls" if tool_calls else "stop"


def _output_items(
    output: Any, *, want_logprobs: bool
) -> tuple[list[dict[str, Any]] | None, list[str] | None, list[float] | None, bool]:
    """Tool calls, reasoning texts and the output text's logprobs of a response's `output`, and
    whether any item holds tokens that carry no logprobs (function calls, reasoning)."""
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    logprobs: list[float] = []
    untexted = False
    if not isinstance(output, list):
        raise MalformedResponseError("response output is not a list")
    for item in output:
        if not isinstance(item, dict):
            raise MalformedResponseError("a response output item is not an object")
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                entries = part.get("logprobs") if isinstance(part, dict) else None
                if want_logprobs and entries is not None:
                    try:
                        logprobs.extend(e["logprob"] for e in entries)
                    except (TypeError, KeyError) as exc:
                        raise MalformedResponseError(
                            f"output logprobs are malformed: {exc}"
                        ) from exc
        elif kind == "function_call":
            untexted = True
            tool_calls.append({k: item.get(k) for k in ("call_id", "name", "arguments", "id")})
        elif kind == "reasoning":
            untexted = True
            parts = [*(item.get("content") or ()), *(item.get("summary") or ())]
            reasoning.append("".join(p.get("text") or "" for p in parts if isinstance(p, dict)))
        else:
            untexted = True
    return (
        tool_calls or None,
        reasoning or None,
        logprobs if want_logprobs else None,
        untexted,
    )


def parse_responses_body(payload: Any, info: RequestInfo) -> ParsedChoice:
    """The one call of a Responses body (non-stream, or the final event's `response`)."""
    if not isinstance(payload, dict) or payload.get("object", "response") != "response":
        raise MalformedResponseError("response body is not a Responses object")
    choice = ParsedChoice(
        index=0,
        prompt_ids=None,
        sampled_ids=None,
        logprobs=None,
        finish_reason=None,
        stop_reason=None,
    )
    try:
        status = payload.get("status")
        if status in ("queued", "in_progress"):
            raise MissingTokenIdsError(
                f"the response is {status} (background mode): its ids are not in this body.",
                fix="call the Responses API without background=true on vLLM hosts",
            )
        if status == "failed":
            raise MalformedResponseError(f"the response failed: {payload.get('error')}")
        tool_calls, reasoning, lps, untexted = _output_items(
            payload.get("output") or [], want_logprobs=info.wants_logprobs
        )
        choice.tool_calls, choice.reasoning = tool_calls, reasoning
        if info.want_message:  # token-in sessions compare it with the next request's input
            choice.message = assistant_message(payload.get("output"))
        choice.finish_reason = _responses_finish(payload, tool_calls)
        choice.prompt_ids = _engine_tokens(payload, "input_messages")
        choice.sampled_ids = _engine_tokens(payload, "output_messages")
        if choice.prompt_ids is None or choice.sampled_ids is None:
            raise MissingTokenIdsError(
                "the Responses body has no input_messages/output_messages token ids although "
                "enable_response_messages was sent; the server ignored it.",
                fix=_NO_MESSAGES_FIX,
            )
        sampled = int(choice.sampled_ids.shape[0])
        if lps is not None and len(lps) == sampled:
            choice.logprobs = np.array(lps, dtype=np.float32)
        elif lps is not None and not (untexted or info.stream) and (lps or payload.get("output")):
            # a non-stream text answer has one entry per sampled id (EOS included): not here
            raise TokenCountMismatchError(f"{len(lps)} logprobs for {sampled} sampled ids.")
        # else, known gaps of vLLM 0.32, where the ids stay exact and the call has no logprobs:
        # tokens turned into function calls / reasoning (or into no item at all) carry none, and a
        # stream's entries are per text delta (none for the EOS, one for the tokens of a
        # character split across tokens); equal counts mean one entry per id, in order
        usage = payload.get("usage")
        if isinstance(usage, dict):
            for key, ids in (
                ("output_tokens", choice.sampled_ids),
                ("input_tokens", choice.prompt_ids),
            ):
                count = usage.get(key)
                if isinstance(count, int) and count != ids.shape[0]:
                    raise TokenCountMismatchError(f"{ids.shape[0]} ids but usage.{key} is {count}.")
    except CaptureError as exc:
        choice.error = exc
    return choice


def responses_caller_view(payload: dict[str, Any], info: RequestInfo) -> dict[str, Any]:
    """The Responses body as the caller would have got it without capture: the fields capture
    added set to null, as vLLM sends them when not asked."""
    if info.added_ids:
        for key in _RESPONSE_ID_KEYS:
            if key in payload:
                payload[key] = None
    if info.added_logprobs:
        if info.added_top_logprobs and "top_logprobs" in payload:
            payload["top_logprobs"] = None
        for item in payload.get("output") or ():
            if isinstance(item, dict) and item.get("type") == "message":
                for part in item.get("content") or ():
                    if isinstance(part, dict) and "logprobs" in part:
                        part["logprobs"] = None
    return payload

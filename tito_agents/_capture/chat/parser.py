"""The chat completions and completions parser: choices keyed by `index`, prompt ids top-level
(chat) or per choice (completions), delta ids concatenated per index, usage checked when present.
Long arrays of a body are cut out and parsed as arrays (`fastpath`)."""

from __future__ import annotations

import operator
import re
from array import array
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson

from tito_agents._capture.wire.fastpath import _BodySegments, _FallBack
from tito_agents._capture.wire.request import RequestInfo
from tito_agents._capture.wire.response import ParsedChoice, ResponseParser, to_ids
from tito_agents._capture.wire.splice import Path, null_values
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


def _added_paths(payload: dict[str, Any], ids: bool, logprobs: bool) -> list[Path]:
    """Where the answers to what capture added sit in a parsed body (only the fields it holds)."""
    paths: list[Path] = [(key,) for key in _TOP_ID_KEYS if ids and key in payload]
    for i, choice in enumerate(payload["choices"]):
        keys = (*(_CHOICE_ID_KEYS if ids else ()), *(("logprobs",) if logprobs else ()))
        paths += (("choices", i, key) for key in keys if key in choice)
    return paths


_LOGPROB = operator.itemgetter("logprob")

_NO_IDS_FIX = (
    "use vLLM >= 0.10.2 (it returns ids when a request carries return_token_ids), or do not mark "
    "this host as vLLM if it is another server"
)


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
            index = call.get("index", 0)
            if type(index) is not int:  # the slots are sorted by it in `message`
                raise MalformedResponseError("a streamed tool call index is not an integer")
            slot = self.tool_calls.setdefault(index, {"arguments": []})
            if call.get("id"):
                slot["id"] = call["id"]
            function = call.get("function") or {}
            if function.get("name"):
                slot["name"] = function["name"]
            arguments = function.get("arguments")
            if arguments:
                if type(arguments) is not str:  # joined in `message`
                    raise MalformedResponseError("streamed tool call arguments are not a string")
                slot["arguments"].append(arguments)


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


class ChoicesParser(ResponseParser, endpoints=(Endpoint.CHAT, Endpoint.COMPLETIONS)):
    """The `ResponseParser` of chat completions and completions (see the module docstring)."""

    STREAM_END = re.compile(rb"\[DONE\]")

    def __init__(self, info: RequestInfo) -> None:
        super().__init__(info)
        self._choices: dict[int, _ChoiceAccumulator] = {}
        self._segments: _BodySegments | None = None
        # read once per stream event: kept as plain attributes
        self._chat = info.endpoint is Endpoint.CHAT
        self._layout: Literal["chat", "completions"] = "chat" if self._chat else "completions"
        self._logprobs = info.wants_logprobs
        self._message = info.want_message

    # ---- non-streaming ----

    def parse_body(self, body: bytes) -> list[ParsedChoice]:
        """Parse a complete JSON response body.

        The long arrays (prompt ids, sampled ids, logprob entries) are cut out of the body and
        parsed as arrays; only the small rest goes through the JSON parser. A body whose layout is
        unexpected falls back to parsing it whole, which also produces the precise error.
        """
        self._body = body
        segments = _BodySegments.split(body, self._layout, logprobs=self._logprobs)
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
        """See `ResponseParser.caller_body`: the server's bytes with each added field null (in
        the skeleton where the body was cut, the arrays left standing then put back)."""
        info, payload = self.info, self._payload
        if payload is None or not (info.added_ids or info.added_logprobs):
            return None
        segments = self._segments
        if (
            segments is None
        ):  # a short body, parsed whole: cut now, it is joined cheaper than walked
            segments = _BodySegments.split(
                self._body, self._layout, logprobs=info.added_logprobs, min_size=0
            )
            if segments is not None:
                payload = orjson.loads(segments.skeleton)
        paths = _added_paths(payload, info.added_ids, info.added_logprobs)
        if segments is None:
            return null_values(self._body, paths)
        nulled = segments.nulled_at(payload, paths)
        if nulled is not None:  # each added field is a cut-out array (or wraps one): no walk
            return segments.join(nulled)
        return segments.restore(null_values(segments.skeleton, paths))

    def _parse_body_choice(self, raw: Any, top_prompt: IdArray | None) -> ParsedChoice:
        if not isinstance(raw, dict):
            raise MalformedResponseError("a choice is not an object")
        index = raw.get("index", 0)
        if type(index) is not int:
            raise MalformedResponseError("a choice index is not an integer")
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
                    choice.logprobs = segments.logprobs(content)  # no entry objects built
                    if choice.logprobs is None:  # the scan was unsure: parse the entries
                        entries = {"content": segments.logprob_entries(content)}
                        choice.logprobs = _chat_logprobs(entries, "logprobs")
                else:
                    choice.logprobs = _chat_logprobs(lp, what)
            elif self._segments is not None and isinstance(lp, str):
                choice.logprobs = self._segments.logprobs(lp)  # read while cut out
                if choice.logprobs is None:  # not cut-out logprobs: the full parse says why
                    raise _FallBack
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
        if type(choices) is not list:
            raise MalformedResponseError("a stream chunk's choices is not a list")
        for raw in choices:
            if type(raw) is not dict:
                raise MalformedResponseError("a streamed choice is not an object")
            index = raw.get("index", 0)
            if type(index) is not int:  # choices are keyed, then sorted, by it
                raise MalformedResponseError("a streamed choice index is not an integer")
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

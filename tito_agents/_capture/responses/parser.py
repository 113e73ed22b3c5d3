"""The Responses API parser (vLLM 0.32, `enable_response_messages: true`).

One response is one call (choice index 0): `input_messages[0].tokens` is the prompt the engine
saw, `output_messages[0].tokens` what it sampled (EOS included). The output items say what the
parsers made of them: `message` (text, with per-token logprobs when asked), `function_call`,
`reasoning`. vLLM gives logprobs only for output text: tokens its parsers turn into function
calls or reasoning carry none, so such a call keeps exact ids and no logprobs. In a stream the
entries are per text delta (the EOS has none): unless they cover every id, the call has none.
Only the final stream event (`response.completed`, or `response.incomplete` / `response.failed`)
carries the ids."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from tito_agents._capture.responses.chat_view import assistant_message
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

_RESPONSES_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_RESPONSE_ID_KEYS = ("input_messages", "output_messages")

_NO_MESSAGES_FIX = (
    "use vLLM >= 0.32 for the Responses API (earlier versions return input_messages/"
    "output_messages only for gpt-oss models, and never in streams), call the chat completions "
    "endpoint instead, or do not mark this host as vLLM if it is another server"
)


def _engine_tokens(
    payload: dict[str, Any], key: str, segments: _BodySegments | None
) -> IdArray | None:
    """The token ids of `input_messages` / `output_messages`: None when the field is absent or
    null (the server ignored `enable_response_messages`). A cut-out array (a marker string in a
    cut body) is read by `segments`."""
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
    tokens = entry["tokens"]
    if segments is not None and isinstance(tokens, str):
        return segments.ids(tokens)
    return to_ids(tokens, f"{key}[0].tokens")


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


def _parts(item: dict[str, Any], key: str) -> list[Any]:
    """The parts list of an output item (none when absent)."""
    parts = item.get(key)
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise MalformedResponseError(f"a response output item's {key} is not a list")
    return parts


def _output_items(
    output: Any, *, want_logprobs: bool, segments: _BodySegments | None = None
) -> tuple[list[dict[str, Any]] | None, list[str] | None, list[Any] | LogprobArray | None, bool]:
    """Tool calls, reasoning texts and the output text's logprobs of a response's `output`, and
    whether any item holds tokens that carry no logprobs (function calls, reasoning).

    In a body cut by `segments` (`parse_body`), a part's entries the C helper read are a marker:
    their logprobs come as an array, and all of them as one array when every part was read so
    (what vLLM sends); otherwise the logprobs are a list of the entries' values."""
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    logprobs: list[Any] = []
    scanned: list[LogprobArray] = []
    untexted = False
    if not isinstance(output, list):
        raise MalformedResponseError("response output is not a list")
    for item in output:
        if not isinstance(item, dict):
            raise MalformedResponseError("a response output item is not an object")
        kind = item.get("type")
        if kind == "message":
            for part in _parts(item, "content"):
                entries = part.get("logprobs") if isinstance(part, dict) else None
                if want_logprobs and segments is not None and isinstance(entries, str):
                    values = segments.logprobs(entries)  # read while cut out
                    if values is None:  # not cut-out entries: the full parse says why
                        raise _FallBack
                    if logprobs:  # after a part that was not read: its values as a list
                        logprobs.extend(values.tolist())
                    else:
                        scanned.append(values)
                elif want_logprobs and entries is not None:
                    if scanned:  # the parts read so far, as values (float32 kept exactly)
                        logprobs.extend(np.concatenate(scanned).tolist())
                        scanned.clear()
                    try:
                        logprobs.extend(e["logprob"] for e in entries)
                    except (TypeError, KeyError) as exc:
                        raise MalformedResponseError(
                            f"output logprobs are malformed: {exc}"
                        ) from exc
        elif kind == "function_call":
            untexted = True
            call = {k: item.get(k) for k in ("call_id", "name", "arguments", "id")}
            if item.get("namespace") is not None:  # a namespaced tool's call (vLLM >= 0.32)
                call["namespace"] = item["namespace"]
            tool_calls.append(call)
        elif kind == "reasoning":
            untexted = True
            parts = [*_parts(item, "content"), *_parts(item, "summary")]
            reasoning.append("".join(p.get("text") or "" for p in parts if isinstance(p, dict)))
        else:
            untexted = True
    if not want_logprobs:
        return tool_calls or None, reasoning or None, None, untexted
    read = np.concatenate(scanned) if scanned else logprobs
    return tool_calls or None, reasoning or None, read, untexted


def parse_responses_body(
    payload: Any, info: RequestInfo, segments: _BodySegments | None = None
) -> ParsedChoice:
    """The one call of a Responses body (non-stream, or the final event's `response`); with the
    `segments` its payload was parsed from when it was cut (`_FallBack`: parse it whole)."""
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
            payload.get("output") or [], want_logprobs=info.wants_logprobs, segments=segments
        )
        choice.tool_calls, choice.reasoning = tool_calls, reasoning
        if info.want_message:  # token-in sessions compare it with the next request's input
            choice.message = assistant_message(payload.get("output"))
        choice.finish_reason = _responses_finish(payload, tool_calls)
        choice.prompt_ids = _engine_tokens(payload, "input_messages", segments)
        choice.sampled_ids = _engine_tokens(payload, "output_messages", segments)
        if choice.prompt_ids is None or choice.sampled_ids is None:
            raise MissingTokenIdsError(
                "the Responses body has no input_messages/output_messages token ids although "
                "enable_response_messages was sent; the server ignored it.",
                fix=_NO_MESSAGES_FIX,
            )
        sampled = int(choice.sampled_ids.shape[0])
        if lps is not None and len(lps) == sampled:
            choice.logprobs = np.array(lps, dtype=np.float32)
        elif (
            lps is not None
            and not (untexted or info.stream)
            and (len(lps) > 0 or payload.get("output"))
        ):
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
    except _FallBack:
        raise
    except Exception as exc:  # a shape not expected: the call is unusable, never a raise
        choice.error = MalformedResponseError(f"unreadable response ({exc!r})")
    return choice


def added_paths(payload: dict[str, Any], info: RequestInfo) -> list[Path]:
    """Where the answers to what capture added sit in a parsed Responses body: the engine
    messages (ids), `top_logprobs` and the logprobs of each output text part (logprobs); only
    the fields the body holds. The caller's copy has them null, as vLLM sends them unasked."""
    paths: list[Path] = []
    if info.added_ids:
        paths += ((key,) for key in _RESPONSE_ID_KEYS if key in payload)
    if info.added_logprobs:
        if info.added_top_logprobs and "top_logprobs" in payload:
            paths.append(("top_logprobs",))
        output = payload.get("output")
        for i, item in enumerate(output if isinstance(output, list) else ()):
            if not isinstance(item, dict) or item.get("type") != "message":
                continue
            content = item.get("content")
            if isinstance(content, list):
                paths += (
                    ("output", i, "content", j, "logprobs")
                    for j, part in enumerate(content)
                    if isinstance(part, dict) and "logprobs" in part
                )
    return paths


class ResponsesParser(ResponseParser, endpoints=(Endpoint.RESPONSES,)):
    """The `ResponseParser` of the Responses API (see the module docstring)."""

    STREAM_END = re.compile(rb"response\.(?:completed|incomplete|failed)")

    def __init__(self, info: RequestInfo) -> None:
        super().__init__(info)
        self._final: list[ParsedChoice] | None = None
        """A stream: the choice parsed from its final event."""
        self._segments: _BodySegments | None = None
        """A non-stream body's cut (`parse_body`), when it was cut."""

    # ---- non-streaming ----

    def parse_body(self, body: bytes) -> list[ParsedChoice]:
        """Parse a complete Responses body. Its ids and the logprob entries of its output parts
        are cut out (`_BodySegments`) and read as arrays, so no Python int per id nor entry object
        is built. A body the cut does not suit is parsed whole."""
        self._body = body
        segments = _BodySegments.split(body, "responses", logprobs=self.info.wants_logprobs)
        try:
            payload = orjson.loads(segments.skeleton if segments else body)
            one = [parse_responses_body(payload, self.info, segments)]
        except (orjson.JSONDecodeError, _FallBack):
            segments = None
            try:
                payload = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise MalformedResponseError(f"response body is not valid JSON: {exc}") from exc
            one = [parse_responses_body(payload, self.info)]
        self._segments = segments
        self.response_id = payload.get("id")
        self.model = payload.get("model")
        self.done = True
        self._payload = payload
        return one

    def caller_body(self) -> bytes | None:
        """See `ResponseParser.caller_body` (`added_paths`)."""
        info, payload = self.info, self._payload
        if payload is None or not (info.added_ids or info.added_logprobs):
            return None
        paths = added_paths(payload, info)
        if self._segments is None:
            return null_values(self._body, paths)
        return self._segments.restore(null_values(self._segments.skeleton, paths))

    # ---- streaming ----

    def feed_event(self, event: Any) -> None:
        """Absorb one decoded SSE data payload (a dict): only the final event carries the ids;
        `error` fails the call."""
        if type(event) is not dict:
            raise MalformedResponseError("SSE event is not a JSON object")
        self._feed_responses_event(event)

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
        """The stream's one choice, from its final event (none when that event never came)."""
        return list(self._final or ())

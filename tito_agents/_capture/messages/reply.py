"""vLLM 0.32's Messages answer, made from the chat completion answer it is converted from.

Capture sends a Messages call to `/v1/chat/completions` as vLLM's own conversion
(`messages.convert`); this module turns the chat answer back into what vLLM's `/v1/messages`
answers, by the code of `AnthropicServingMessages` (vllm/entrypoints/anthropic/serving.py):

* `messages_response`: a chat completion body to the Messages body (`messages_full_converter`):
  a thinking block (its signature a fresh `uuid4().hex`), a text block, tool_use blocks (ids as
  the chat answer has them, `input` decoded from the arguments), one empty text block when there
  is nothing else; `stop_reason` / `stop_sequence` (`_to_anthropic_stop_reason`); usage net of
  cached tokens (`_build_anthropic_usage`). `encode_body` renders it as vLLM's JSONResponse does.
* `MessagesStream`: chat SSE chunks (parsed) to Messages SSE events, chunk by chunk, as
  `message_stream_converter` does: message_start on the first chunk, content_block_start / delta /
  stop per block, a thinking block's signature_delta at its stop, text that arrives inside a
  tool_use block held until the block ends (vLLM buffers only that), message_delta on the usage
  chunk, message_stop on `[DONE]`. vLLM sends no `ping`. `encode_event` renders an event as vLLM
  does (`event: NAME\\ndata: JSON\\n\\n`, pydantic's compact JSON with the fields in model order).
* `error_body`: an error in vLLM's Anthropic shape (`translate_error_response`).

Where vLLM's converter raises (a tool call whose arguments are not a JSON object), the status and
error type are vLLM's; the message is pydantic's own wording in vLLM and approximated here.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MessagesStream",
    "ReplyError",
    "encode_body",
    "encode_event",
    "error_body",
    "messages_response",
]

Event = tuple[str, dict[str, Any]]
"""A Messages SSE event: its name and its data."""


class ReplyError(Exception):
    """vLLM's `/v1/messages` answers this error instead (`status`, `body`)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["error"]["message"])
        self.status = status
        self.body = body


def error_body(kind: str, message: str) -> dict[str, Any]:
    """vLLM's `AnthropicErrorResponse`: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def sanitize(message: str) -> str:
    """vLLM's `sanitize_message`: error text without addresses, tracebacks or file paths."""
    message = re.sub(r" at 0x[0-9a-fA-F]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+", "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


def encode_body(body: Mapping[str, Any]) -> bytes:
    """A JSON body as vLLM's JSONResponse (starlette) renders it."""
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode()


def encode_event(name: str, data: Mapping[str, Any]) -> bytes:
    """One Messages SSE event as vLLM writes it (`wrap_data_with_event`)."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n".encode()


def usage(info: Any) -> dict[str, int]:
    """`_build_anthropic_usage`: input tokens net of cache reads and writes, which are reported
    only when the chat usage has them (`--enable-prompt-tokens-details`)."""
    if not isinstance(info, Mapping):
        return {"input_tokens": 0, "output_tokens": 0}
    input_tokens = info.get("prompt_tokens") or 0
    cache: dict[str, int] = {}
    details = info.get("prompt_tokens_details")
    if isinstance(details, Mapping):
        if (read := details.get("cached_tokens")) is not None:
            input_tokens -= read
            cache["cache_read_input_tokens"] = read
        if (created := details.get("created_cache_tokens")) is not None:
            input_tokens -= created
            cache["cache_creation_input_tokens"] = created
    out = {
        "input_tokens": max(0, input_tokens),
        "output_tokens": info.get("completion_tokens") or 0,
    }
    for key in ("cache_creation_input_tokens", "cache_read_input_tokens"):
        if key in cache:
            out[key] = cache[key]
    return out


def stop_reason(
    finish: Any, matched: Any, tool_used: bool, tool_complete: bool
) -> tuple[str | None, str | None]:
    """`_to_anthropic_stop_reason`: (stop_reason, stop_sequence) of a chat finish reason."""
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    if finish == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def _signature() -> str:
    return uuid.uuid4().hex


def messages_response(
    chat: Mapping[str, Any], *, signature: Callable[[], str] = _signature
) -> dict[str, Any]:
    """The Messages body vLLM answers for the chat completion body `chat` (its first choice).

    Raises `ReplyError` where vLLM's converter fails (tool arguments that are not JSON, or JSON
    that is not an object or null)."""
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    calls = message.get("tool_calls") or []
    reason, sequence = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), bool(calls), bool(calls)
    )
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        block = {"type": "thinking", "thinking": message["reasoning"], "signature": signature()}
        content.append(block)
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in calls:
        content.append(_tool_use(call))
    if not content:
        content.append({"type": "text", "text": ""})
    body: dict[str, Any] = {"id": chat["id"], "type": "message", "role": "assistant"}
    body["content"] = content
    body["model"] = chat["model"]
    if reason is not None:
        body["stop_reason"] = reason
    if sequence is not None:
        body["stop_sequence"] = sequence
    body["usage"] = usage(chat.get("usage"))
    for key in ("kv_transfer_params", "ec_transfer_params"):
        if chat.get(key) is not None:
            body[key] = chat[key]
    return body


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError as error:
        raise ReplyError(400, error_body("BadRequestError", sanitize(str(error)))) from None
    block = {"type": "tool_use", "id": call["id"], "name": function["name"]}
    if isinstance(arguments, dict):
        block["input"] = arguments
    elif arguments is not None:
        kind = type(arguments).__name__
        message = (
            "1 validation error for AnthropicContentBlock\ninput\n  Input should be a valid "
            f"dictionary [type=dict_type, input_value={arguments!r}, input_type={kind}]\n"
            "    For further information visit https://errors.pydantic.dev/2.14/v/dict_type"
        )
        raise ReplyError(400, error_body("BadRequestError", message))
    return block


class MessagesStream:
    """vLLM's `message_stream_converter` as a state machine: `chunk` takes each parsed chat
    chunk as it arrives, `done` the `[DONE]` line; both return the Messages events to send now.

    After an error event (a chunk vLLM could not read) the stream is over, as in vLLM."""

    def __init__(self, *, signature: Callable[[], str] = _signature) -> None:
        self._signature = signature
        self._first = True
        self.finished = False
        self._finish: Any = None
        self._matched: Any = None
        self._tool_used = False
        self._last_args: list[str] = []
        self._ids: dict[int, str] = {}
        self._next = 0
        self._reset()

    def _reset(self) -> None:
        self._kind: str | None = None
        self._index: int | None = None
        self._pending_signature: str | None = None
        self._tool_id: str | None = None
        self._pending: list[str] = []

    # vLLM's helpers -------------------------------------------------------------------------------

    def _at(self) -> int:
        return self._index if self._index is not None else self._next

    def _stop_block(self) -> list[Event]:
        if self._kind is None:
            return []
        events: list[Event] = []
        if self._kind == "thinking" and self._pending_signature is not None:
            delta = {"type": "signature_delta", "signature": self._pending_signature}
            events.append(_delta(delta, self._index))
        events.append(("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._reset()
        self._next += 1
        return events

    def _start_block(self, block: dict[str, Any]) -> Event:
        data = {"type": "content_block_start", "content_block": block, "index": self._next}
        self._kind, self._index = block["type"], self._next
        self._pending_signature = self._signature() if block["type"] == "thinking" else None
        self._tool_id = block["id"] if block["type"] == "tool_use" else None
        return ("content_block_start", data)

    def _stop_and_flush(self) -> list[Event]:
        buffered = "".join(self._pending)
        had = bool(self._pending)
        self._pending.clear()
        events = self._stop_block()
        if not had:
            return events
        events.append(self._start_block({"type": "text", "text": ""}))
        events.append(_delta({"type": "text_delta", "text": buffered}, self._index))
        return events + self._stop_block()

    # the stream -----------------------------------------------------------------------------------

    def done(self) -> list[Event]:
        """The chat stream's `[DONE]`: the open block ends, then message_stop."""
        if self.finished:
            return []
        self.finished = True
        return [*self._stop_and_flush(), ("message_stop", {"type": "message_stop"})]

    def chunk(self, chunk: Any) -> list[Event]:
        """One chat completion chunk (a parsed `data:` line other than `[DONE]`)."""
        if self.finished:
            return []
        problem = _unreadable(chunk)
        if problem is not None:
            self.finished = True
            error = {"type": "internal_error", "message": sanitize(problem)}
            return [("error", {"type": "error", "error": error})]
        if self._first:
            self._first = False
            message = {
                "id": chunk.get("id") or f"chatcmpl-{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": chunk["model"],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage(chunk.get("usage")),
            }
            return [("message_start", {"type": "message_start", "message": message})]
        if not chunk["choices"]:
            return self._message_delta(chunk)
        choice = chunk["choices"][0]
        if choice.get("finish_reason") is not None:
            self._finish, self._matched = choice["finish_reason"], choice.get("stop_reason")
        delta = choice["delta"]
        events: list[Event] = []
        if delta.get("reasoning"):
            if self._kind != "thinking":
                events += self._stop_and_flush()
                events.append(self._start_block({"type": "thinking", "thinking": ""}))
            thinking = {"type": "thinking_delta", "thinking": delta["reasoning"]}
            events.append(_delta(thinking, self._at()))
        if delta.get("content"):
            if self._kind == "tool_use":
                self._pending.append(delta["content"])
            else:
                if self._kind != "text":
                    events += self._stop_and_flush()
                    events.append(self._start_block({"type": "text", "text": ""}))
                events.append(_delta({"type": "text_delta", "text": delta["content"]}, self._at()))
        for call in delta.get("tool_calls") or ():
            events += self._tool_call(call)
        return events

    def _message_delta(self, chunk: Mapping[str, Any]) -> list[Event]:
        events = self._stop_and_flush()
        complete = self._tool_used and _is_json("".join(self._last_args))
        reason, sequence = stop_reason(
            self._finish or "stop", self._matched, self._tool_used, complete
        )
        data = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(chunk.get("usage")),
        }
        return [*events, ("message_delta", data)]

    def _tool_call(self, call: Mapping[str, Any]) -> list[Event]:
        function = call.get("function") or {}
        events: list[Event] = []
        call_id = call.get("id")
        if call_id is not None:
            self._ids[call["index"]] = call_id
            name = function.get("name")
            if self._tool_id != call_id and name is not None:
                events += self._stop_and_flush()
                self._tool_used = True
                self._last_args = []
                block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                events.append(self._start_block(block))
        else:
            call_id = self._ids.get(call["index"])
        arguments = function.get("arguments")
        if call_id is not None and arguments and self._tool_id == call_id:
            self._last_args.append(arguments)
            events.append(
                _delta({"type": "input_json_delta", "partial_json": arguments}, self._at())
            )
        return events


def _delta(delta: dict[str, Any], index: int | None) -> Event:
    return ("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": index})


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _unreadable(chunk: Any) -> str | None:
    """Why vLLM's `ChatCompletionStreamResponse` would refuse `chunk` (None when it reads it):
    vLLM then sends an error event with pydantic's message, approximated here."""
    if not isinstance(chunk, Mapping):
        return "the chunk is not a JSON object"
    if "error" in chunk and "choices" not in chunk:
        return f"the chat stream failed: {chunk['error']}"
    if not isinstance(chunk.get("model"), str) or not isinstance(chunk.get("choices"), list):
        return "the chunk has no model or no choices"
    if "id" in chunk and not isinstance(chunk["id"], str):
        return "the chunk id is not a string"
    for choice in chunk["choices"]:
        if not isinstance(choice, Mapping) or not isinstance(choice.get("delta"), Mapping):
            return "a choice has no delta"
        delta = choice["delta"]
        calls = delta.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list)
            and all(isinstance(c, Mapping) and isinstance(c.get("index"), int) for c in calls)
        ):
            return "a delta's tool_calls is not a list of indexed calls"
    return None

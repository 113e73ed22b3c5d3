"""`POST /v1/responses` of the fake vLLM: the Responses API as vLLM 0.32 serves it for a
non-harmony model with the `hermes` tool parser (the project's real server).

vLLM renders a Responses request through the chat path: `instructions` become a system message,
input items become chat messages (a `function_call` joins the assistant message before it, a
`function_call_output` becomes a `tool` message), flat function tools become chat tools. The fake
does the same and runs the chat endpoint's sampling (`_ChatRun`), so one request gives the same
ids on both APIs; only the serialization differs. `enable_response_messages: true` adds
`input_messages` / `output_messages` (`{"message", "tokens", "type": "raw_message_tokens"}`); a
stream sends them only in `response.completed`. Shapes checked against
tests/data/real_vllm/responses_*.txt.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from tito_agents.testing.fake_vllm._chat import _ChatRun
from tito_agents.testing.fake_vllm._engine import Engine, Json, Reply, WireFaults
from tito_agents.testing.fake_vllm._logprobs import Scored
from tito_agents.testing.fake_vllm._model import Sample
from tito_agents.testing.fake_vllm._requests import (
    FakeHTTPError,
    bad_request,
    check_responses,
    parse_chat,
)
from tito_agents.testing.fake_vllm._responses_input import (
    NAMESPACE_SEPARATOR,
    chat_messages,
    chat_params,
    chat_tool_choice,
    chat_tools,
)

__all__ = ["responses"]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_PASSED = ("model", "temperature", "top_p", "seed", "kv_transfer_params")


def responses(engine: Engine, body: dict[str, Any], faults: WireFaults) -> Reply:
    """Answer a Responses API request body."""
    if body.get("previous_response_id") is not None:
        # vLLM 0.32 stores responses only with VLLM_ENABLE_RESPONSES_API_STORE=1 (off by default)
        raise FakeHTTPError(
            404,
            f"Response with id '{body['previous_response_id']}' not found.",
            err_type="invalid_request_error",
            param="response_id",
            suffix=False,
        )
    if body.get("background"):
        raise bad_request("background mode needs VLLM_ENABLE_RESPONSES_API_STORE", "background")
    check_responses(body)
    chat_body = _as_chat(body)
    request = parse_chat(
        chat_body, max_model_len=engine.settings.max_model_len, vocab_size=engine.codec.vocab_size
    )
    engine.check_model(request.sampling.model)
    run = _ChatRun(engine, request, faults)
    return _ResponsesRun(run, body, faults).reply()


# -- request: Responses -> chat ----------------------------------------------------------------


def _as_chat(body: dict[str, Any]) -> Json:
    """The chat request vLLM renders and samples for a Responses body (the conversion rules are
    `_responses_input`: the fake's own copy, see its docstring for why)."""
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
        )
    include = body.get("include") or []
    chat: Json = {k: body[k] for k in _PASSED if k in body}
    chat["messages"] = chat_messages(body)
    chat.update(chat_params(body))
    tools = chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        chat["tool_choice"] = chat_tool_choice(body.get("tool_choice", "auto"), body.get("tools"))
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    if LOGPROBS_INCLUDE in include:
        chat["logprobs"] = True
        chat["top_logprobs"] = body.get("top_logprobs") or 0
    chat["return_token_ids"] = True
    return chat


def _namespaced(tools: list[Json] | None) -> dict[str, tuple[str, str]]:
    """Flat name -> (namespace, name) of the request's namespace functions: vLLM answers a call
    of `crm__f` as a `function_call` named `f` in namespace `crm`
    (`build_responses_tool_call_name_map`)."""
    names: dict[str, tuple[str, str]] = {}
    for tool in tools or []:
        if tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if inner.get("type") == "function":
                    flat = f"{tool.get('name')}{NAMESPACE_SEPARATOR}{inner.get('name')}"
                    names[flat] = (str(tool.get("name")), str(inner.get("name")))
    return names


# -- response ----------------------------------------------------------------------------------


def _hex_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _usage(prompt: int, output: int) -> Json:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": output,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": prompt + output,
    }


def _tool_echo(tool: Json) -> Json:
    if tool.get("type") != "function":  # namespace, custom and built-in tools as given
        return dict(tool)
    return {
        "name": tool.get("name"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict"),
        "type": "function",
        "allowed_callers": None,
        "async": None,
        "defer_loading": tool.get("defer_loading"),
        "description": tool.get("description"),
        "output_schema": None,
    }


def _logprob_entries(positions: Sequence[Scored], *, with_bytes: bool) -> list[Json]:
    entries = []
    for position in positions:
        step = position.step
        assert step is not None, "generated positions always have logprobs"
        token = position.texts[step.token_id]
        entry: Json = {"token": token}
        if with_bytes:
            entry["bytes"] = list(token.encode("utf-8", "replace"))
        entry["logprob"] = step.logprob
        entry["top_logprobs"] = []
        entries.append(entry)
    return entries


class _ResponsesRun:
    """One Responses request: the chat run's sample, serialized as a Responses body or stream."""

    def __init__(self, run: _ChatRun, body: dict[str, Any], faults: WireFaults) -> None:
        self.run = run
        self.body = body
        self.faults = faults
        self.sample: Sample = run.samples[0]
        self.id = _hex_id("resp")
        self.created = int(time.time())
        self.want_messages = body.get("enable_response_messages") is True
        self.want_logprobs = LOGPROBS_INCLUDE in (body.get("include") or [])
        content, calls, _ = run._message(self.sample)
        self.content = content or ""
        self.calls = calls
        scored = run._scored(self.sample) if self.want_logprobs else None
        # vLLM 0.32 gives logprobs for output text only: none when the tokens became calls
        self.scored: list[Scored] = list(scored or ()) if not calls else []
        self.message_id = _hex_id("msg")
        self.call_ids = [_hex_id("fc") for _ in calls]
        self.namespaced = _namespaced(body.get("tools"))

    def reply(self) -> Reply:
        if self.body.get("stream"):
            return Reply(events=self._events(), named_events=True)
        return Reply(body=self._response(self._output(), final=True))

    # the response object -------------------------------------------------------------------

    def _incomplete(self) -> bool:
        return self.sample.finish_reason == "length"

    def _response(self, output: list[Json], *, final: bool) -> Json:
        body, run = self.body, self.run
        tools = body.get("tools") or []
        sampled = self.sample.token_ids
        if self.faults.length_mismatch:
            sampled = sampled[:-1]
        messages = self.want_messages and final and not self.faults.no_token_ids
        status = ("incomplete" if self._incomplete() else "completed") if final else "in_progress"
        return {
            "id": self.id,
            "created_at": self.created,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if final and self._incomplete() else None
            ),
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": run.engine.settings.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": float(body.get("temperature", 1.0)),
            "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
            "tools": [_tool_echo(t) for t in tools],
            "top_p": float(body.get("top_p", 1.0)),
            "background": False,
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "previous_response_id": None,
            "prompt": None,
            "reasoning": body.get("reasoning"),
            "service_tier": body.get("service_tier", "auto"),
            "status": status,
            "text": body.get("text"),
            "top_logprobs": body.get("top_logprobs"),
            "truncation": body.get("truncation", "disabled"),
            "usage": _usage(len(run.prompt_ids), len(self.sample.steps)) if final else None,
            "user": body.get("user"),
            "presence_penalty": float(body.get("presence_penalty", 0.0)),
            "frequency_penalty": float(body.get("frequency_penalty", 0.0)),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": (
                [
                    {
                        "message": run.prompt_text or "",
                        "tokens": list(run.prompt_ids),
                        "type": "raw_message_tokens",
                    }
                ]
                if messages
                else None
            ),
            "output_messages": (
                [{"message": self._raw_text(), "tokens": sampled, "type": "raw_message_tokens"}]
                if messages
                else None
            ),
        }

    def _raw_text(self) -> str:
        codec = self.run.engine.codec
        return codec.decode(self.sample.token_ids, skip_special_tokens=True)

    def _text_part(self, *, done: bool) -> Json:
        scored = self.scored
        if self.body.get("stream"):  # a stream's final text holds the entries of its deltas
            scored = [p for _, positions in self._text_deltas() for p in positions]
        logprobs = _logprob_entries(scored, with_bytes=True) if self.want_logprobs else None
        return {
            "annotations": [],
            "text": self.content if done else "",
            "type": "output_text",
            "logprobs": logprobs if done else ([] if self.want_logprobs else None),
        }

    def _message_item(self, *, done: bool) -> Json:
        return {
            "id": self.message_id,
            "content": [self._text_part(done=True)] if done else [],
            "role": "assistant",
            "status": "completed" if done else "in_progress",
            "type": "message",
            "phase": None,
        }

    def _call_item(self, index: int, *, done: bool) -> Json:
        call = self.calls[index]["function"]
        namespace, name = self.namespaced.get(call["name"], (None, call["name"]))
        return {
            "arguments": call["arguments"] if done else "",
            "call_id": self.calls[index]["id"],
            "name": name,
            "type": "function_call",
            "id": self.call_ids[index],
            "async": None,
            "caller": None,
            "namespace": namespace,
            "status": "completed" if done else "in_progress",
        }

    def _output(self) -> list[Json]:
        output = [self._message_item(done=True)] if self.content else []
        return output + [self._call_item(i, done=True) for i in range(len(self.calls))]

    # the stream ----------------------------------------------------------------------------

    def _events(self) -> list[Any]:
        events: list[Json] = []

        def add(kind: str, **fields: Any) -> None:
            # vLLM 0.32 sends the event's keys sorted (all but function_call_arguments.done)
            event = {**fields, "sequence_number": len(events), "type": kind}
            events.append(dict(sorted(event.items())))

        add("response.created", response=self._response([], final=False))
        add("response.in_progress", response=self._response([], final=False))
        index = 0
        if self.content:
            item_id = self.message_id
            add("response.output_item.added", item=self._message_item(done=False), output_index=0)
            add(
                "response.content_part.added",
                content_index=0,
                item_id=item_id,
                output_index=0,
                part=self._text_part(done=False),
            )
            for delta, positions in self._text_deltas():
                fields: Json = {"content_index": 0, "delta": delta, "item_id": item_id}
                if self.want_logprobs:
                    fields["logprobs"] = _logprob_entries(positions, with_bytes=False)
                add("response.output_text.delta", **fields, output_index=0)
            add(
                "response.output_text.done",
                content_index=0,
                item_id=item_id,
                logprobs=[],
                output_index=0,
                text=self.content,
            )
            add(
                "response.content_part.done",
                content_index=0,
                item_id=item_id,
                output_index=0,
                part=self._text_part(done=True),
            )
            add("response.output_item.done", item=self._message_item(done=True), output_index=0)
            index = 1
        for i in range(len(self.calls)):
            out = index + i
            add("response.output_item.added", item=self._call_item(i, done=False), output_index=out)
            arguments = self.calls[i]["function"]["arguments"]
            for piece in _pieces(arguments):
                add(
                    "response.function_call_arguments.delta",
                    delta=piece,
                    item_id=self.call_ids[i],
                    output_index=out,
                )
            events.append(
                {
                    "arguments": arguments,
                    "item_id": self.call_ids[i],
                    "output_index": out,
                    "sequence_number": len(events),
                    "type": "response.function_call_arguments.done",
                    "name": self._call_item(i, done=True)["name"],
                }
            )
            add("response.output_item.done", item=self._call_item(i, done=True), output_index=out)
        add("response.completed", response=self._response(self._output(), final=True))
        return events

    def _text_deltas(self) -> list[tuple[str, list[Scored]]]:
        """One delta per sampled token that releases text, with one logprob entry: vLLM 0.32
        streams logprobs per text delta, so the tokens of a character split across tokens share
        one entry and tokens that release no text (the EOS) have none."""
        deltas: list[tuple[str, list[Scored]]] = []
        for position, step in enumerate(self.sample.steps):
            if step.text and step.token_id not in self.run.engine.codec.special_ids:
                scored = self.scored[position : position + 1]
                deltas.append((step.text, scored))
        return deltas


def _pieces(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]

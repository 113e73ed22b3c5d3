"""`POST /v1/chat/completions` of the fake vLLM: one request's prompt, samples and serializations.

Follows vLLM 0.32's chat handler with the `hermes` tool parser configured (as the project's real
server runs): message assembly, tool-call finish reasons, echo, stream chunk selection.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from tito_agents.testing.fake_vllm import _wire as wire
from tito_agents.testing.fake_vllm._engine import (
    DONE,
    Engine,
    Json,
    Reply,
    StreamEvent,
    WireFaults,
    conversation,
    returned_ids,
    round_robin,
    strip_events,
    strip_token_ids,
)
from tito_agents.testing.fake_vllm._logprobs import Scored, masked
from tito_agents.testing.fake_vllm._model import RequestView, Sample
from tito_agents.testing.fake_vllm._requests import ChatRequest, parse_chat
from tito_agents.testing.fake_vllm._tools import (
    HermesStream,
    ToolDelta,
    new_tool_call_id,
    parse_tool_calls,
)

__all__ = ["chat"]


def chat(engine: Engine, body: dict[str, Any], faults: WireFaults) -> Reply:
    """Answer a chat completions request body."""
    request = parse_chat(
        body, max_model_len=engine.settings.max_model_len, vocab_size=engine.codec.vocab_size
    )
    engine.check_model(request.sampling.model)
    return _ChatRun(engine, request, faults).reply()


class _ChatRun:
    """One chat request: its prompt, its samples, and both of its serializations."""

    def __init__(self, engine: Engine, request: ChatRequest, faults: WireFaults) -> None:
        self.engine = engine
        self.request = request
        self.faults = faults
        sampling = request.sampling
        codec = engine.codec
        self.prompt_text: str | None = None
        if request.token_in is not None:
            self.prompt_ids = list(request.token_in)
            prompt_text = codec.decode(self.prompt_ids)
        else:
            prompt_text = self.prompt_text = engine.render_chat(request)
            self.prompt_ids = codec.encode(
                prompt_text, add_special_tokens=request.add_special_tokens
            )
        # vLLM's hermes parser turns skip_special_tokens off whenever it may parse tool calls.
        skip_special = sampling.skip_special_tokens and not request.tools_active
        rules = engine.stop_rules(sampling, len(self.prompt_ids), skip_special_tokens=skip_special)
        self.samples = [
            engine.model.sample(self._view(prompt_text, index), rules)
            for index in range(sampling.n)
        ]
        self.role = (
            "assistant" if request.add_generation_prompt else str(request.messages[-1].get("role"))
        )
        self.hide = faults.include_reasoning_nulls and not request.include_reasoning
        self.return_ids = sampling.return_token_ids and not self.hide
        self.as_ids = engine.as_token_ids(sampling)
        self.id = engine.new_id("chatcmpl")
        self.created = int(time.time())

    def _view(self, prompt_text: str, index: int) -> RequestView:
        request, sampling = self.request, self.request.sampling
        return RequestView(
            endpoint="chat",
            prompt_ids=tuple(self.prompt_ids),
            prompt_text=prompt_text,
            messages=request.messages,
            tools=request.tools,
            tool_choice=request.tool_choice,
            choice_index=index,
            seed=sampling.seed,
            temperature=sampling.temperature,
            body=sampling.body,
        )

    def reply(self) -> Reply:
        if self.request.sampling.stream:
            return Reply(events=self._events())
        return Reply(body=self._body())

    # shared --------------------------------------------------------------------------------

    def _scored(self, sample: Sample) -> list[Scored] | None:
        if not self.request.logprobs or self.hide:
            return None
        scored = self.engine.score_sampled(
            self.prompt_ids, sample.token_ids, self.request.top_logprobs
        )
        return masked(scored) if self.request.constrained else scored

    def _logprobs(self, positions: Sequence[Scored]) -> Json:
        return wire.chat_logprobs(positions, self.request.top_logprobs, as_ids=self.as_ids)

    def _echo_text(self) -> str:
        last = self.request.messages[-1]
        if not self.request.sampling.echo or last.get("role") != self.role:
            return ""
        return conversation([last])[0].get("content") or ""

    def _token_ids(self, ids: list[int], *, final: bool) -> list[int] | None:
        return returned_ids(ids, enabled=self.return_ids, final=final, faults=self.faults)

    def _prompt_logprobs_json(self) -> list[Any] | None:
        request = self.request
        top_k = request.sampling.prompt_logprobs
        if top_k is None and request.sampling.echo:
            top_k = request.top_logprobs
        if top_k is None:
            return None
        return wire.prompt_logprobs_json(self.engine.score_prompt(self.prompt_ids, top_k))

    def _returned_prompt_text(self) -> str | None:
        """`prompt_text` (vLLM 0.32 `return_prompt_text`): the rendered template, else null."""
        return self.prompt_text if self.request.return_prompt_text else None

    def _usage(self, completion_tokens: int, shape: str) -> Json:
        return wire.usage(len(self.prompt_ids), completion_tokens, shape=shape)

    # non-stream ----------------------------------------------------------------------------

    def _message(self, sample: Sample) -> tuple[str | None, list[Json], str]:
        """(content, tool_calls, finish_reason) the way vLLM's chat handler assembles them."""
        request, text = self.request, sample.text
        if not request.tools_active:
            return text, [], sample.finish_reason
        parsed = parse_tool_calls(text)
        calls = [_tool_call(name, arguments) for name, arguments in parsed.calls]
        if request.tool_choice == "required" or request.named_tool:
            tool_finish = request.tool_choice == "required" and sample.finish_reason == "stop"
            return (
                parsed.content or "",
                calls,
                "tool_calls" if tool_finish else sample.finish_reason,
            )
        if calls:
            return parsed.content, calls, "tool_calls"
        return text, [], sample.finish_reason

    def _body(self) -> Json:
        echo = self._echo_text()
        choices = []
        for sample in self.samples:
            content, calls, finish = self._message(sample)
            if echo:
                content = echo + (content or "")
            scored = self._scored(sample)
            choices.append(
                wire.chat_choice(
                    sample.index,
                    wire.chat_message(self.role, content, calls),
                    None if scored is None else self._logprobs(scored),
                    finish,
                    sample.stop_reason,
                    self._token_ids(sample.token_ids, final=True),
                )
            )
        body = wire.chat_body(
            response_id=self.id,
            created=self.created,
            model=self.engine.settings.model,
            choices=choices,
            fingerprint=self.engine.settings.system_fingerprint,
            usage_json=self._usage(sum(len(s.steps) for s in self.samples), "full"),
            prompt_logprobs=self._prompt_logprobs_json(),
            prompt_token_ids=self.prompt_ids if self.request.sampling.return_token_ids else None,
            prompt_text=self._returned_prompt_text(),
        )
        return strip_token_ids(body) if self.faults.no_token_ids else body

    # stream --------------------------------------------------------------------------------

    def _chunk(self, choice: Json | None, **extra: Any) -> Json:
        return wire.chat_chunk(
            response_id=self.id,
            created=self.created,
            model=self.engine.settings.model,
            choice=choice,
            **extra,
        )

    def _events(self) -> list[StreamEvent]:
        options = self.request.sampling.stream_options
        continuous = options.include_usage and options.continuous_usage_stats
        opening_usage = self._usage(0, "chunk") if continuous else None
        prompt_ids = self.prompt_ids if self.request.sampling.return_token_ids else None
        events: list[StreamEvent] = []
        for sample in self.samples:
            delta = {"role": self.role, "content": ""}
            choice = wire.chat_stream_choice(sample.index, delta, None, None, has_token_ids=False)
            events.append(
                self._chunk(
                    choice,
                    usage_json=opening_usage,
                    prompt_token_ids=prompt_ids,
                    prompt_text=self._returned_prompt_text(),
                    role_chunk=True,
                )
            )
        echo = self._echo_text()
        for sample in self.samples if echo else ():
            choice = wire.chat_stream_choice(
                sample.index, {"content": echo}, None, None, has_token_ids=False
            )
            events.append(self._chunk(choice, usage_json=opening_usage))
        events += round_robin([self._choice_chunks(sample) for sample in self.samples])
        if options.include_usage:
            total = sum(len(s.steps) for s in self.samples)
            events.append(
                self._chunk(
                    None,
                    usage_json=self._usage(total, "final"),
                    fingerprint=self.engine.settings.system_fingerprint,
                )
            )
        events.append(DONE)
        return strip_events(events) if self.faults.no_token_ids else events

    def _choice_chunks(self, sample: Sample) -> list[Json]:
        """One chunk per sampled token of one choice, minus the ones vLLM would not send."""
        options = self.request.sampling.stream_options
        continuous = options.include_usage and options.continuous_usage_stats
        fingerprint = None if options.include_usage else self.engine.settings.system_fingerprint
        parser = HermesStream() if self.request.tools_active else None
        scored = self._scored(sample)
        chunks: list[Json] = []
        text = ""
        for position, step in enumerate(sample.steps):
            last = position == len(sample.steps) - 1
            text += step.text
            delta = _parser_delta(parser, text, last) if parser else _plain_delta(step.text)
            logprobs = None if scored is None else self._logprobs(scored[position : position + 1])
            if delta is None:  # nothing to say yet: tool markup, partial UTF-8, held-back text
                wanted = logprobs is not None or self.return_ids
                if not last and (self.faults.drop_parser_chunks or not wanted):
                    continue
                delta = {}
            elif self.hide:  # vLLM sets `reasoning` explicitly when reasoning is hidden
                delta = _with_null_reasoning(delta)
            choice = wire.chat_stream_choice(
                sample.index,
                delta,
                logprobs,
                self._stream_finish(sample, parser) if last else None,
                token_ids=self._token_ids([step.token_id], final=last),
                stop_reason=sample.stop_reason,
            )
            usage = self._usage(position + 1, "chunk") if continuous else None
            last_fingerprint = fingerprint if last else None
            chunks.append(self._chunk(choice, usage_json=usage, fingerprint=last_fingerprint))
        return chunks

    def _stream_finish(self, sample: Sample, parser: HermesStream | None) -> str:
        """ "tool_calls" once a call was streamed and generation stopped (not for a named tool)."""
        called = parser is not None and parser.called
        if called and not self.request.named_tool and sample.finish_reason == "stop":
            return "tool_calls"
        return sample.finish_reason


def _plain_delta(text: str) -> Json | None:
    """The delta without a tool parser: the released text, or None when there is none."""
    return {"content": text} if text else None


def _with_null_reasoning(delta: Json) -> Json:
    """`DeltaMessage` key order (content, reasoning, tool_calls) with `reasoning` set to null."""
    ordered: Json = {"content": delta.get("content"), "reasoning": None}
    if "tool_calls" in delta:
        ordered["tool_calls"] = delta["tool_calls"]
    return ordered


def _tool_call(name: str, arguments: str) -> Json:
    return {
        "id": new_tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _parser_delta(parser: HermesStream, text: str, last: bool) -> Json | None:
    """A streamed delta from the hermes parser: `{"content": ..., "tool_calls": [...]}` or None."""
    fed = parser.feed(text, finished=last)
    if fed is None:
        return None
    content, deltas = fed
    delta: Json = {"content": content}
    if deltas:
        delta["tool_calls"] = [_tool_delta_json(d) for d in deltas]
    return delta


def _tool_delta_json(delta: ToolDelta) -> Json:
    if delta.name is not None:
        return {
            "id": delta.call_id,
            "type": "function",
            "index": delta.index,
            "function": {"name": delta.name},
        }
    return {"index": delta.index, "function": {"arguments": delta.arguments}}

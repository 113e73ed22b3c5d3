"""`POST /v1/completions` of the fake vLLM: string or token prompts, legacy logprobs, echo quirks.

Every prompt gets `n` choices; choice indices run prompt-major, as in vLLM. With `echo` the prompt
text is prepended, except when `return_token_ids` is set (vLLM's quirk, kept on purpose), and the
legacy logprobs then cover the prompt tokens too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tito_agents.testing.fake_vllm import _wire as wire
from tito_agents.testing.fake_vllm._engine import (
    DONE,
    Engine,
    Json,
    Reply,
    StreamEvent,
    WireFaults,
    returned_ids,
    round_robin,
    strip_events,
    strip_token_ids,
)
from tito_agents.testing.fake_vllm._logprobs import Scored
from tito_agents.testing.fake_vllm._model import RequestView, Sample
from tito_agents.testing.fake_vllm._requests import CompletionRequest, parse_completion

__all__ = ["completions"]


def completions(engine: Engine, body: dict[str, Any], faults: WireFaults) -> Reply:
    """Answer a completions request body."""
    request = parse_completion(
        body, max_model_len=engine.settings.max_model_len, vocab_size=engine.codec.vocab_size
    )
    engine.check_model(request.sampling.model)
    return _CompletionRun(engine, request, faults).reply()


@dataclass(frozen=True)
class _Prompt:
    ids: list[int]
    text: str


class _CompletionRun:
    """One completions request: possibly several prompts, each with `n` choices."""

    def __init__(self, engine: Engine, request: CompletionRequest, faults: WireFaults) -> None:
        self.engine = engine
        self.request = request
        self.faults = faults
        codec = engine.codec
        self.prompts = [
            _Prompt(list(p), codec.decode(p))
            if isinstance(p, tuple)
            else _Prompt(codec.encode(p, add_special_tokens=request.add_special_tokens), p)
            for p in request.prompts
        ]
        sampling = request.sampling
        self.samples: list[tuple[_Prompt, Sample]] = []
        for prompt in self.prompts:
            rules = engine.stop_rules(
                sampling, len(prompt.ids), skip_special_tokens=sampling.skip_special_tokens
            )
            for index in range(sampling.n):
                view = self._view(prompt, index)
                self.samples.append((prompt, engine.model.sample(view, rules)))
        self.as_ids = engine.as_token_ids(sampling)
        self.id = engine.new_id("cmpl")
        self.created = int(time.time())

    def _view(self, prompt: _Prompt, choice_index: int) -> RequestView:
        sampling = self.request.sampling
        return RequestView(
            endpoint="completions",
            prompt_ids=tuple(prompt.ids),
            prompt_text=prompt.text,
            messages=(),
            tools=(),
            tool_choice=None,
            choice_index=choice_index,
            seed=sampling.seed,
            temperature=sampling.temperature,
            body=sampling.body,
        )

    def reply(self) -> Reply:
        if self.request.sampling.stream:
            return Reply(events=self._events())
        return Reply(body=self._body())

    def _prompt_top_k(self) -> int | None:
        top_k = self.request.sampling.prompt_logprobs
        return self.request.logprobs if top_k is None and self.request.sampling.echo else top_k

    def _echo(self, prompt: _Prompt) -> tuple[str, list[Scored]]:
        """What echo prepends: the prompt text (empty with `return_token_ids`, vLLM's quirk)
        and, when logprobs are requested, the scored prompt positions."""
        if not self.request.sampling.echo:
            return "", []
        text = "" if self.request.sampling.return_token_ids else prompt.text
        if self.request.logprobs is None:
            return text, []
        return text, self.engine.score_prompt(prompt.ids, self._prompt_top_k() or 0)

    def _scored(self, prompt: _Prompt, sample: Sample) -> list[Scored]:
        if self.request.logprobs is None:
            return []
        return self.engine.score_sampled(prompt.ids, sample.token_ids, self.request.logprobs)

    def _legacy_logprobs(self, positions: list[Scored], offset: int) -> Json | None:
        """Legacy logprobs of `positions`, text offsets counted from `offset`."""
        if self.request.logprobs is None:
            return None
        return wire.completion_logprobs(
            positions, self.request.logprobs, as_ids=self.as_ids, text_offset=offset
        )

    def _prompt_logprobs_json(self, prompt: _Prompt) -> list[Any] | None:
        top_k = self._prompt_top_k()
        if top_k is None:
            return None
        return wire.prompt_logprobs_json(self.engine.score_prompt(prompt.ids, top_k))

    def _token_ids(self, ids: list[int], *, final: bool) -> list[int] | None:
        enabled = self.request.sampling.return_token_ids
        return returned_ids(ids, enabled=enabled, final=final, faults=self.faults)

    def _body(self) -> Json:
        sampling = self.request.sampling
        choices = []
        for output_index, (prompt, sample) in enumerate(self.samples):
            echo_text, echo_scored = self._echo(prompt)
            choices.append(
                wire.completion_choice(
                    output_index,
                    echo_text + sample.text,
                    self._legacy_logprobs(echo_scored + self._scored(prompt, sample), 0),
                    sample.finish_reason,
                    sample.stop_reason,
                    self._token_ids(sample.token_ids, final=True),
                    self._prompt_logprobs_json(prompt),
                    prompt.ids if sampling.return_token_ids else None,
                )
            )
        body = wire.completion_body(
            response_id=self.id,
            created=self.created,
            model=self.engine.settings.model,
            choices=choices,
            fingerprint=self.engine.settings.system_fingerprint,
            usage_json=self._usage(shape="full"),
        )
        return strip_token_ids(body) if self.faults.no_token_ids else body

    def _usage(self, *, shape: str) -> Json:
        prompt_tokens = sum(len(p.ids) for p in self.prompts)
        return wire.usage(prompt_tokens, sum(len(s.steps) for _, s in self.samples), shape=shape)

    def _chunk(self, choice: Json | None, **extra: Any) -> Json:
        return wire.completion_chunk(
            response_id=self.id,
            created=self.created,
            model=self.engine.settings.model,
            choice=choice,
            **extra,
        )

    def _events(self) -> list[StreamEvent]:
        per_choice = [self._choice_chunks(i, p, s) for i, (p, s) in enumerate(self.samples)]
        events: list[StreamEvent] = list(round_robin(per_choice))
        if self.request.sampling.stream_options.include_usage:
            events.append(
                self._chunk(
                    None,
                    usage_json=self._usage(shape="final"),
                    fingerprint=self.engine.settings.system_fingerprint,
                )
            )
        events.append(DONE)
        return strip_events(events) if self.faults.no_token_ids else events

    def _choice_chunks(self, output_index: int, prompt: _Prompt, sample: Sample) -> list[Json]:
        """One chunk per sampled token; the first also carries the echo and the prompt ids."""
        sampling = self.request.sampling
        options = sampling.stream_options
        fingerprint = None if options.include_usage else self.engine.settings.system_fingerprint
        echo_text, echo_scored = self._echo(prompt)
        scored = self._scored(prompt, sample)
        chunks, offset = [], 0
        for position, step in enumerate(sample.steps):
            first, last = position == 0, position == len(sample.steps) - 1
            text = (echo_text if first else "") + step.text
            positions = (echo_scored if first else []) + scored[position : position + 1]
            choice = wire.completion_stream_choice(
                output_index,
                text,
                self._legacy_logprobs(positions, offset),
                sample.finish_reason if last else None,
                sample.stop_reason if last else None,
                prompt.ids if first and sampling.return_token_ids else None,
                self._token_ids([step.token_id], final=last),
            )
            offset += len(text)
            usage = (
                wire.usage(len(prompt.ids), position + 1, shape="final")
                if options.include_usage and options.continuous_usage_stats
                else None
            )
            chunks.append(
                self._chunk(choice, usage_json=usage, fingerprint=fingerprint if last else None)
            )
        return chunks

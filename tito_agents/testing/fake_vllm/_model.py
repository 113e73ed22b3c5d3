"""The fake vLLM's generation core: what the "model" says, turned into sampled ids and released text.

One function, `FakeModel.sample`, serves every endpoint and both stream and non-stream responses.
A responder decides the text (or exact ids) of a choice; the model tokenizes it (canonically, or
with drift), appends EOS, and then plays it through vLLM's stop logic one token at a time:

* EOS ends with `finish_reason="stop"`, `stop_reason=None`; a `stop_token_ids` hit ends with the
  token id as `stop_reason`. Both tokens are in `token_ids`; their text is not (unless
  `include_stop_str_in_output`).
* A stop string is searched in the newly released text, as vLLM's `check_stop_strings` does; the
  token completing it stays in `token_ids`, the text is cut at (or after) the match, possibly in the
  middle of a token, and `stop_reason` is the string.
* `max_tokens` ends with `"length"` and no EOS.
* While stop strings are active, the last `max(len(stop)) - 1` characters are held back from each
  step's text and released later, so streamed text deltas do not follow token boundaries.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tito_agents.testing.fake_vllm._codec import TextDecoder, TokenCodec
from tito_agents.testing.fake_vllm._hash import mix

__all__ = [
    "FakeModel",
    "RequestView",
    "Responder",
    "Sample",
    "Step",
    "StopRules",
    "Tokenization",
]

Tokenization = Literal["canonical", "drift"]


@dataclass(frozen=True)
class RequestView:
    """What a responder sees of one choice of one request.

    `prompt_ids` are the ids the model is conditioned on (the rendered chat prompt, the
    `kv_transfer_params` token-in ids, or a completions prompt); `prompt_text` is their text.
    `messages`, `tools` and `tool_choice` are empty/None for `/v1/completions`. `body` is the raw
    request JSON, for responders that want to read anything else.
    """

    endpoint: Literal["chat", "completions"]
    prompt_ids: tuple[int, ...]
    prompt_text: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    tool_choice: str | Mapping[str, Any] | None
    choice_index: int
    seed: int | None
    temperature: float
    body: Mapping[str, Any]

    @property
    def sample_key(self) -> int:
        """A stable key for this choice's randomness: greedy decoding ignores seed and index."""
        if self.temperature == 0:
            return 0
        return mix(mix(self.seed or 0, self.choice_index), 0x5A3)


Responder = Callable[[RequestView], "str | Sequence[int]"]
"""Returns what the model says: text (tokenized by the fake, EOS appended) or exact sampled ids."""


@dataclass(frozen=True)
class StopRules:
    """The stop-related sampling parameters of a request, resolved."""

    max_tokens: int
    eos_id: int
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    ignore_eos: bool = False

    @property
    def holdback(self) -> int:
        """Characters withheld from streamed text while a stop string might still match."""
        if not self.stop or self.include_stop_str_in_output:
            return 0
        return max(len(s) for s in self.stop) - 1


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step of one choice: the sampled id and the text released with it."""

    token_id: int
    text: str


@dataclass(frozen=True)
class Sample:
    """One finished choice: every sampled id with its released text, and why it ended."""

    index: int
    prompt_ids: tuple[int, ...]
    steps: tuple[Step, ...]
    finish_reason: Literal["stop", "length"]
    stop_reason: int | str | None

    @property
    def token_ids(self) -> list[int]:
        return [step.token_id for step in self.steps]

    @property
    def text(self) -> str:
        return "".join(step.text for step in self.steps)


class FakeModel:
    """Turns a responder's words into sampled ids and plays them through vLLM's stop logic."""

    def __init__(
        self,
        codec: TokenCodec,
        responder: Responder,
        *,
        tokenization: Tokenization = "canonical",
        drift_rate: float = 0.25,
        eos_id: int,
    ) -> None:
        self.codec = codec
        self.responder = responder
        self.tokenization = tokenization
        self.drift_rate = drift_rate
        self.eos_id = eos_id

    def plan(self, view: RequestView) -> list[int]:
        """The ids the model would emit if nothing stopped it: the response, then EOS."""
        said = self.responder(view)
        if isinstance(said, str):
            ids = self.codec.encode(said, add_special_tokens=False)
            if self.tokenization == "drift":
                ids = self.codec.drift(ids, rate=self.drift_rate, key=view.sample_key)
        else:
            ids = [int(token_id) for token_id in said]
            invalid = [t for t in ids if not self.codec.is_valid_id(t)]
            if invalid:
                raise ValueError(f"responder returned ids outside the vocabulary: {invalid[:5]}")
        if not ids or ids[-1] != self.eos_id:
            ids.append(self.eos_id)
        return ids

    def sample(self, view: RequestView, rules: StopRules) -> Sample:
        """Generate one choice."""
        planned = self.plan(view)
        stream: Iterator[int] = itertools.cycle(planned) if rules.ignore_eos else iter(planned)
        return _play(self.codec, view, rules, stream)


def _play(codec: TokenCodec, view: RequestView, rules: StopRules, planned: Iterator[int]) -> Sample:
    decoder: TextDecoder = codec.text_decoder(skip_special_tokens=rules.skip_special_tokens)
    steps: list[Step] = []
    text, released = "", 0
    finish: Literal["stop", "length"] | None = None
    stop_reason: int | str | None = None
    for token_id in planned:
        if token_id == rules.eos_id and not rules.ignore_eos:
            finish = "stop"
        elif token_id in rules.stop_token_ids:
            finish, stop_reason = "stop", token_id
        if finish is None or (stop_reason is not None and rules.include_stop_str_in_output):
            new_text = decoder.push(token_id)
            text += new_text
            hit = _find_stop(text, len(new_text), rules) if finish is None else None
            if hit is not None:
                stop_reason, cut = hit
                text = text if cut < 0 else text[:cut]
                finish = "stop"
        if finish is None and len(steps) + 1 >= rules.max_tokens:
            finish = "length"
        upto = len(text) if finish else max(released, len(text) - rules.holdback)
        steps.append(Step(token_id, text[released:upto]))
        released = upto
        if finish:
            return Sample(view.choice_index, view.prompt_ids, tuple(steps), finish, stop_reason)
    raise AssertionError("a planned sequence always ends with EOS")  # pragma: no cover


def _find_stop(text: str, new_chars: int, rules: StopRules) -> tuple[str, int] | None:
    """vLLM's `check_stop_strings`: (stop string, cut position or -1 for "keep all")."""
    if not new_chars:
        return None
    for stop in rules.stop:
        index = text.find(stop, max(0, len(text) + 1 - new_chars - len(stop)))
        if index == -1:
            continue
        if rules.include_stop_str_in_output:
            index += len(stop)
            if index >= len(text):
                return stop, -1
        return stop, index
    return None

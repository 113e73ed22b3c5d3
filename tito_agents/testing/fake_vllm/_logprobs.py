"""The fake model's logprobs: a pure function of (all preceding ids, token id).

A real model's logprob for a token depends only on the ids before it. The fake keeps exactly that
property, so scoring a sampled sequence again, e.g. as a `/v1/completions` token prompt with
`prompt_logprobs`, returns the very values reported while sampling. That is what rescoring tests
need. Values lie in (-10, 0] and are rounded to float32 like the engine's.

The "top" alternatives at a position are a fixed pool of candidate ids derived from the context;
the sampled token is always listed first, as vLLM does, whatever its rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tito_agents.testing.fake_vllm._hash import float32, fold, mix, unit_interval

__all__ = ["LogprobModel", "Scored", "StepLogprobs", "masked"]

_CONTEXT_SEED = 0x7117_0A6E
_CANDIDATE_SALT = 0x5EED_CA4D
_POOL_SIZE = 20
"""Alternatives per position; vLLM's default `max_logprobs` is 20 as well."""


@dataclass(frozen=True, slots=True)
class StepLogprobs:
    """The engine's logprob dict at one position: the actual token first, then alternatives."""

    token_id: int
    logprob: float
    ranked: tuple[tuple[int, float], ...]
    """`(id, logprob)` pairs in engine order: the actual token, then the best alternatives."""
    ranks: tuple[int, ...] = ()
    """Vocabulary rank of each `ranked` entry (prompt positions only)."""


@dataclass(frozen=True, slots=True)
class Scored:
    """One position of a scored sequence, with the text vLLM shows for each candidate id.

    `step` is None where there is no logprob (the first prompt token). `texts` holds the
    `decoded_token` of the actual id and every alternative, decoded in context (see
    `TokenCodec.logprob_texts`).
    """

    token_id: int
    step: StepLogprobs | None
    texts: dict[int, str]


class LogprobModel:
    """Deterministic logprobs over a vocabulary, never proposing special tokens as alternatives."""

    def __init__(self, vocab_size: int, excluded: frozenset[int]) -> None:
        self._vocab_size = vocab_size
        self._excluded = excluded

    @staticmethod
    def context(token_ids: Sequence[int]) -> int:
        """The hash state after `token_ids`; extend it with `advance`."""
        return fold(token_ids, _CONTEXT_SEED)

    @staticmethod
    def advance(context: int, token_id: int) -> int:
        return mix(context, token_id)

    @staticmethod
    def logprob(context: int, token_id: int) -> float:
        """log p(token | context), in (-10, 0]."""
        u = unit_interval(mix(context ^ 0x10C9_0B5, token_id))
        return float32(-9.99 * u * u)

    def candidates(self, context: int) -> list[tuple[int, float]]:
        """The alternative pool at this position, best first."""
        seen: set[int] = set()
        pool: list[tuple[int, float]] = []
        salt = 0
        while len(pool) < _POOL_SIZE:
            salt += 1
            token_id = mix(context, _CANDIDATE_SALT + salt) % self._vocab_size
            if token_id in seen or token_id in self._excluded:
                continue
            seen.add(token_id)
            pool.append((token_id, self.logprob(context, token_id)))
        pool.sort(key=lambda item: (-item[1], item[0]))
        return pool

    def step(self, context: int, token_id: int, top_k: int) -> StepLogprobs:
        """The logprob dict for a sampled token with `top_k` alternatives requested."""
        logprob = self.logprob(context, token_id)
        ranked: list[tuple[int, float]] = [(token_id, logprob)]
        if top_k:
            pool = self.candidates(context)
            limit = len(pool) if top_k < 0 else top_k
            ranked += [pair for pair in pool if pair[0] != token_id][:limit]
        return StepLogprobs(token_id, logprob, tuple(ranked))

    def sampled(
        self, prompt_ids: Sequence[int], token_ids: Sequence[int], top_k: int
    ) -> list[StepLogprobs]:
        """Logprobs of each generated token, given the prompt and the tokens before it."""
        context = self.context(prompt_ids)
        steps: list[StepLogprobs] = []
        for token_id in token_ids:
            steps.append(self.step(context, token_id, top_k))
            context = self.advance(context, token_id)
        return steps

    def prompt(self, prompt_ids: Sequence[int], top_k: int) -> list[StepLogprobs | None]:
        """`prompt_logprobs`: nothing for the first token, then each token given those before it."""
        result: list[StepLogprobs | None] = [None] if prompt_ids else []
        context = self.context(prompt_ids[:1])
        for token_id in prompt_ids[1:]:
            result.append(self._prompt_position(context, token_id, top_k))
            context = self.advance(context, token_id)
        return result

    def _prompt_position(self, context: int, token_id: int, top_k: int) -> StepLogprobs:
        logprob = self.logprob(context, token_id)
        pool = [pair for pair in self.candidates(context) if pair[0] != token_id]
        ranked = [(token_id, logprob)]
        ranks = [1 + sum(1 for _, other in pool if other > logprob)]
        for position, (other_id, other_logprob) in enumerate(pool[: max(top_k, 0)]):
            ranked.append((other_id, other_logprob))
            ranks.append(position + 1 if other_logprob > logprob else position + 2)
        return StepLogprobs(token_id, logprob, tuple(ranked), tuple(ranks))


MASK_SCALE = 0.25
"""How the fake's grammar mask moves a sampled token's logprob toward 0 (renormalized over the
allowed tokens, the masked distribution gives the sampled token more mass)."""


def masked(positions: Sequence[Scored]) -> list[Scored]:
    """The logprobs vLLM reports for tokens sampled under a grammar mask (forced tool choice,
    structured output): those of the masked distribution, not of the free model. On the real CPU
    vLLM they differ from a re-scoring of the same ids by 0.6-1.3 nats on average; the fake scales
    them toward 0 so that re-scoring (`prompt_logprobs`, which is unmasked) tells them apart."""
    out = []
    for pos in positions:
        step = pos.step
        if step is not None:
            ranked = tuple((t, float32(lp * MASK_SCALE)) for t, lp in step.ranked)
            step = StepLogprobs(
                step.token_id, float32(step.logprob * MASK_SCALE), ranked, step.ranks
            )
        out.append(Scored(pos.token_id, step, pos.texts))
    return out

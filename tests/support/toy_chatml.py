"""A toy ChatML vocabulary (specials, role words, letters, letter pairs, unique markers) and calls
of a toy model over it: literal episodes for the merged-assembly tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.support.call_factory import make_call
from tito_agents.calls import Call, CallStatus

ENDOFTEXT, IM_START, IM_END, THINK, END_THINK, NL = 0, 1, 2, 3, 4, 5
SYSTEM, USER, ASSISTANT, TOOL = 6, 7, 8, 9
LETTER0, PAIR0, MARKER0, NUM_MARKERS = 10, 36, 1000, 4000
LETTERS = "abcdefghijklmnopqrstuvwxyz"

VOCAB: list[str] = [""] * (MARKER0 + NUM_MARKERS)
for _i, _text in enumerate(
    ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "\n"]
    + ["system", "user", "assistant", "tool"]
):
    VOCAB[_i] = _text
for _a, _ca in enumerate(LETTERS):
    VOCAB[LETTER0 + _a] = _ca
    for _b, _cb in enumerate(LETTERS):
        VOCAB[PAIR0 + 26 * _a + _b] = _ca + _cb
for _k in range(NUM_MARKERS):
    VOCAB[MARKER0 + _k] = f"#{_k};"

SPECIAL_IDS = frozenset({ENDOFTEXT, IM_START, IM_END, THINK, END_THINK})
EOS_IDS = frozenset({IM_END})
HEADER = [IM_START, ASSISTANT, NL]


def decode(ids: Sequence[int]) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def letter(c: str) -> int:
    return LETTER0 + LETTERS.index(c)


def pair(s: str) -> int:
    return PAIR0 + 26 * LETTERS.index(s[0]) + LETTERS.index(s[1])


def is_pair(token: int) -> bool:
    return PAIR0 <= token < MARKER0


def split_pair(token: int) -> list[int]:
    k = token - PAIR0
    return [LETTER0 + k // 26, LETTER0 + k % 26]


def marker(k: int) -> int:
    return MARKER0 + k


def message(role: int, *content: int) -> list[int]:
    return [IM_START, role, NL, *content, IM_END, NL]


def toy_call(
    call_id: str,
    prompt: Sequence[int] | np.ndarray,
    sampled: Sequence[int],
    *,
    seq: int,
    choice: int = 0,
    agent: str | None = None,
    finish: str = "stop",
    started: float | None = None,
    ended: float | None = None,
    reward: float | None = None,
    logprobs: bool = True,
    policy_version: str | None = None,
    status: CallStatus = CallStatus.COMPLETE,
    labels: dict[str, str] | None = None,
    policy: str | None = None,
) -> Call:
    """A call of the toy model (`tests.support.call_factory.make_call` with the toy's defaults): the `seq`-th
    request, timed by `seq`, one distinct rollout logprob per sampled id; `prompt` given as an
    array is used as is (n>1 choices share one prompt array)."""
    prompt_ids = prompt if isinstance(prompt, np.ndarray) else np.array(prompt, dtype=np.int32)
    lps = -0.01 * (1.0 + np.arange(len(sampled), dtype=np.float32)) - seq if logprobs else None
    return make_call(
        call_id,
        prompt_ids,
        sampled,
        prompt_ids=prompt_ids,
        sampled_ids=np.array(sampled, dtype=np.int32),
        choice_index=choice,
        status=status,
        logprobs=None if lps is None else lps.astype(np.float32),
        finish_reason=finish,
        model="toy",
        started_at=10.0 * seq if started is None else started,
        ended_at=10.0 * seq + 5.0 if ended is None else ended,
        agent=agent,
        seq=seq,
        reward=reward,
        policy_version=policy_version,
        labels=dict(labels or {}),
        policy=policy,
    )

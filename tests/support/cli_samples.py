"""Helpers shared by the `tito-agents` command tests: hand-built samples, running the command."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from tito_agents.cli.main import main
from tito_agents.samples import CallSpan, Sample
from tito_agents.sinks import JsonlSink

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates"
"""Synthetic templates, each failing a known set of audit cases on purpose."""


def trl_templates() -> list[Path]:
    """The real chat templates shipped inside the `trl` package (about 35 model families)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "chat_templates"
    return sorted(folder.glob("*.jinja"))


def run_cli(
    argv: Sequence[str | os.PathLike[str]], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """Run the command in-process; (exit code, stdout, stderr)."""
    code = main([os.fspath(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _sample(
    sample_id: str,
    episode_id: str,
    agent: str | None,
    ids: Sequence[int],
    spans: Sequence[tuple[str, int, int, int, str | None, float | None]],
    *,
    reward: float | None,
    start_reason: str,
    end_reason: str,
    logprobs: bool = False,
) -> Sample:
    token_ids = np.asarray(ids, dtype=np.int32)
    mask = np.zeros(token_ids.shape[0], dtype=np.uint8)
    lps = np.zeros(token_ids.shape[0], dtype=np.float32) if logprobs else None
    call_spans = []
    for call_id, context_start, start, end, finish, call_reward in spans:
        mask[start:end] = 1
        if lps is not None:
            lps[start:end] = -0.25
        call_spans.append(CallSpan(call_id, context_start, start, end, finish, call_reward))
    sample = Sample(
        sample_id=sample_id,
        episode_id=episode_id,
        agent=agent,
        token_ids=token_ids,
        loss_mask=mask,
        logprobs=lps,
        reward=reward,
        call_ids=[s.call_id for s in call_spans],
        spans=call_spans,
        model="test-model",
        start_reason=start_reason,
        end_reason=end_reason,
        view="per_call" if start_reason == "call" else "merged",
    )
    sample.validate()
    return sample


def merged_episode() -> list[Sample]:
    """Two episodes by hand, as merged assembly would write them (several spans per sample).

    Episode `ep1`, agent `solver`: A (two calls: prompt, sampled, tool result, sampled) whose history
    the next call rewrote at position 7 (template_rerender), B (starts with that rewritten history,
    ends because the same prompt was sampled again) and C (the resample of B's prompt, parting at 11);
    agent `critic`: one per-call sample. Episode `ep2`: one merged sample of one call.
    """
    prompt = [1, 2, 3, 4, 5, 6]
    a = _sample(
        "A" * 24,
        "ep1",
        "solver",
        [*prompt, 100, 101, 102, 103, 200, 201, 202, 203, 104, 105, 106],
        [("c1/0", 0, 6, 10, "tool_calls", None), ("c2/0", 10, 14, 17, "stop", 0.5)],
        reward=1.5,
        start_reason="episode_start",
        end_reason="template_rerender",
        logprobs=True,
    )
    b = _sample(
        "B" * 24,
        "ep1",
        "solver",
        [*prompt, 100, 150, 151, 300, 301, 107, 108],
        [("c3/0", 0, 11, 13, "stop", None)],
        reward=1.0,
        start_reason="template_rerender",
        end_reason="resample",
    )
    c = _sample(
        "C" * 24,
        "ep1",
        "solver",
        [*prompt, 100, 150, 151, 300, 301, 109, 110, 111],
        [("c3/1", 0, 11, 14, "length", None)],
        reward=0.0,
        start_reason="resample",
        end_reason="end",
    )
    d = _sample(
        "D" * 24,
        "ep1",
        "critic",
        [1, 2, 3, 400, 401],
        [("c4/0", 0, 3, 5, "stop", None)],
        reward=None,
        start_reason="call",
        end_reason="stop",
    )
    e = _sample(
        "E" * 24,
        "ep2",
        "solver",
        [1, 2, 3, 4, 500, 501, 502],
        [("c5/0", 0, 4, 7, "stop", None)],
        reward=0.5,
        start_reason="episode_start",
        end_reason="end",
    )
    return [a, b, c, d, e]


def write_samples(path: Path, samples: Sequence[Sample]) -> Path:
    """Write samples with the real JSON Lines sink."""
    with JsonlSink(path) as sink:
        sink.write(list(samples))
    return path

"""End-to-end: the LangGraph example agent against a real CPU vLLM.

The example (examples/langgraph_agent.py) is an ordinary LangGraph ReAct agent plus three tito-agents
lines. Run as a script, it must write samples whose episodes never mix (each sample's prompt asks
about its own episode's city), labelled with their graph node and step, and whose free (not
grammar-constrained) calls re-score on the server to the captured rollout logprobs within bf16
noise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

import tito_agents as tito
from tests.support.real_vllm import MAX_TOL, MEAN_TOL
from tests.support.rescore_check import rescore_sample
from tito_agents.testing.smollm2 import load_tokenizer

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "langgraph_agent.py"
EPISODES = 4
# bf16 noise measured on this server (docs/real-vllm.md): mean |Δ| ~ 0.03, max ~ 0.1.


def test_langgraph_example_writes_exact_samples(
    vllm_base_url: str, vllm_model: str, tmp_path: Path
) -> None:
    """The example's samples are per episode, per node, and re-score exactly on the server."""
    out = tmp_path / "samples.jsonl"
    command = [
        sys.executable,
        str(EXAMPLE),
        *("--base-url", vllm_base_url, "--model", vllm_model),
        *("--episodes", str(EPISODES), "--out", str(out)),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    crashed = int(re.search(r"\((\d+) crashed\)", run.stdout).group(1))  # type: ignore[union-attr]

    samples = list(tito.read_samples(out))
    by_episode: dict[str, list[tito.Sample]] = defaultdict(list)
    for sample in samples:
        by_episode[sample.episode_id].append(sample)
    # Every invocation that did not crash is one episode (a crashed one writes no samples).
    assert len(by_episode) == EPISODES - crashed >= 1
    tokenizer = load_tokenizer()
    for episode_samples in by_episode.values():
        (task_id,) = {s.task_id for s in episode_samples}
        city = str(task_id).removeprefix("weather-")
        for sample in episode_samples:
            assert sample.agent == "agent" and sample.reward in (0.0, 1.0)
            assert sample.metadata["labels"]["langgraph_node"] == "agent"
            prompt = tokenizer.decode(sample.token_ids[: sample.spans[0].start].tolist())
            assert f"weather in {city} right now" in prompt  # its own question, never another's
    # The first model call of an episode is a forced (grammar-constrained) tool call: its rollout
    # logprobs are of the masked distribution, which a free re-scoring cannot reproduce (see
    # `constrained` in tests/support/rescore_check.py). The answers after the tool result are
    # free: re-score them.
    # Every episode whose forced call ended on its own goes agent -> tools -> agent. A forced call
    # cut at max_completion_tokens usually carries no complete tool call, and LangGraph then ends
    # the episode after one step; but the cut can fall after the JSON closed (only the end-of-turn
    # token missing), and then the episode goes on too. So cut episodes may or may not answer.
    answers = [s for s in samples if s.metadata["labels"]["langgraph_step"] > 1]
    cut = {
        s.episode_id
        for s in samples
        if s.metadata["labels"]["langgraph_step"] == 1 and s.spans[-1].finish_reason == "length"
    }
    answered = {s.episode_id for s in answers}
    assert set(by_episode) - cut <= answered <= set(by_episode)
    assert answers, f"every forced tool call was cut at max_completion_tokens: {run.stdout}"
    for sample in answers:
        result = rescore_sample(vllm_base_url, vllm_model, sample)
        assert result.mean_abs < MEAN_TOL and result.max_abs < MAX_TOL, result

"""End-to-end: the OpenAI Agents SDK triage example against a real CPU vLLM, on the SDK's default
Responses model and on Chat Completions.

The example runs a triage agent handing off to two tool-using specialists, several episodes at
once. Every per-agent sample it writes must start with its own agent's instructions (attribution
checked by content, on the server's own detokenizer), and re-scoring each sample on the server must
reproduce the captured rollout logprobs of its trained tokens within bf16 noise. On the Responses
API vLLM 0.32 returns logprobs for output text only: a sample made only of tool calls has none
(its ids are still the server's own), and is checked by attribution alone.

One exception, a vLLM fact: a call made with `tool_choice="required"` (how the example makes a
135M model call tools at all) is sampled under a tool-call grammar, and vLLM 0.32 applies the
grammar's mask to the logits *before* computing the returned logprobs. Those logprobs are the
renormalised masked distribution, never lower than the unmasked model's (what re-scoring gives).
Spans that are tool calls get that check; every other span (the specialists' answers) the exact one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

import tito_agents as tito
from tests.support.real_vllm import MAX_TOL, MEAN_TOL
from tests.support.rescore_check import rescored_logprobs

pytest.importorskip("tito_agents_openai_agents", reason="needs tito-agents[openai-agents]")

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = {
    "triage": "Hand billing and invoice questions to billing",
    "billing": "You answer billing questions.",
    "weather": "You answer weather questions.",
}


def detokenize(base_url: str, ids: list[int]) -> str:
    root = base_url.rstrip("/").removesuffix("/v1")
    response = httpx.post(f"{root}/detokenize", json={"tokens": ids}, timeout=60)
    response.raise_for_status()
    return str(response.json()["prompt"])


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_triage_example_writes_exact_samples_per_agent(
    vllm_base_url: str, vllm_model: str, tmp_path: Path, api: str
) -> None:
    """The example's per-agent samples carry their agent's prompt and re-score within noise."""
    out = tmp_path / "agents.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "agents_sdk_triage.py"),
            "--base-url",
            vllm_base_url,
            "--episodes",
            "3",
            "--out",
            str(out),
            "--api",
            api,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== tito-agents x OpenAI Agents SDK: triage ==" in result.stdout
    samples = list(tito.read_samples(out))
    agents = {s.agent for s in samples}
    assert "triage" in agents and agents <= set(INSTRUCTIONS), agents
    assert sum(s.agent == "triage" for s in samples) >= 3  # each episode starts with triage
    tool_spans = exact_spans = 0
    for sample in samples:
        sample.validate()
        prompt = detokenize(vllm_base_url, sample.token_ids[: sample.spans[0].start].tolist())
        system_part = prompt.split("<|im_start|>user")[0]
        found = [agent for agent, text in INSTRUCTIONS.items() if text in system_part]
        assert found == [sample.agent], (sample.agent, system_part[:300])
        if sample.logprobs is None:
            assert api == "responses", sample.agent  # tool calls only: no output-text logprobs
            continue
        again = rescored_logprobs(vllm_base_url, vllm_model, sample.token_ids.tolist())
        for span in sample.spans:
            captured = sample.logprobs[span.start : span.end].astype(np.float64)
            rescored = again[span.start : span.end]
            text = detokenize(vllm_base_url, sample.token_ids[span.start : span.end].tolist())
            if text.lstrip().startswith("<tool_call>"):  # maybe sampled under the tool grammar
                tool_spans += 1
                assert (captured >= rescored - MAX_TOL).all(), (sample.agent, text)
            else:
                exact_spans += 1
                diff = np.abs(captured - rescored)
                assert diff.mean() < MEAN_TOL and diff.max() < MAX_TOL, (sample.agent, text)
    if api == "chat_completions":  # on Responses, tool calls carry no logprobs to re-score
        assert tool_spans >= 3 and exact_spans >= 1, (tool_spans, exact_spans)

"""End-to-end: two GRPO steps with TRL's real `GRPOTrainer` on the real CPU vLLM, the weights
updated in place between them.

`TrlRollout` rolls out through the collector-wrapped client against the session's dev-mode server
(`tests/support/e2e_servers.DEV_MODE`, shared by the RL e2e tests); `attach_engine` makes TRL
use the rollout logprobs in its importance ratio and push the trained weights into that server
before the second batch. Then: the engine's weight version went from "0" to "1" and it scores a
fixed prompt differently, the second batch's spans carry version "1" (read off the engine's
update times, `VersionLog`), re-score exactly against the new weights on the server, and not one
trained token differs from the ids the engine sampled. The original weights are put back.

Async mode (`lag=1`) runs the same two steps: the second batch is the first call's prompt
again, sampled in the background while step 1 trained (TRL handed in another prompt by then), and
each of its samples re-scores exactly against the weights of the version its spans name — "0" is
checked after the original weights are back, "1" before — whichever the timing gave.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("torch", reason="the trainer side needs torch (tito-agents[trainer-check])")
pytest.importorskip("trl", reason="the trainer is TRL's GRPOTrainer")

import tito_agents as tito
from tests.support.e2e_servers import VllmServers, dev_server_url, load_vllm_server_script
from tests.support.real_vllm import MAX_TOL, MEAN_TOL, tokenize
from tests.support.rescore_check import rescore_sample, rescored_logprobs
from tito_agents.rl import TrlRollout, VersionLog, VllmWeights, passthrough_reward
from tito_agents.rl.trl_engine import RatioProbe, attach_engine

# two GRPO steps of SmolLM2-135M in fp32 on the CPU (2 episodes each), one in-place reload:
# ~1-2 min on an idle 2-core machine
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

QUESTIONS = [
    "Name a city in France and say one thing about it.",
    "Name a river in Germany and say one thing about it.",
]


@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
@pytest.mark.parametrize("lag", [0, 1], ids=["sync", "async-lag1"])
def test_two_trl_steps_update_the_engine_in_place(
    vllm_servers: VllmServers, tmp_path: Path, lag: int
) -> None:
    import trl
    from datasets import Dataset

    from tito_agents.trainer_check import load_policy, load_tokenizer

    url = dev_server_url(vllm_servers)
    model_dir = Path(load_vllm_server_script().model_dir())
    served = VllmWeights(url)
    served.update(model_dir, "0")
    name = openai.OpenAI(base_url=url, api_key="EMPTY").models.list().data[0].id
    probe_prompt = tokenize(url, [{"role": "user", "content": "What is the capital of France?"}])
    before = rescored_logprobs(url, name, probe_prompt)[1:]

    versions = VersionLog(initial="0")
    collector = tito.Collector(None, capture_logprobs=True, assembly="merged", policy_version="0")
    client = collector.wrap(openai.AsyncOpenAI(base_url=url, api_key="EMPTY", timeout=900))

    finished = itertools.count()

    async def agent(prompt: Any, client: Any) -> float:
        await client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": str(prompt)}],
            max_tokens=16,
            temperature=1.0,
        )
        # 0 and 1 by order of completion: a group's two episodes always differ, so the advantages
        # are never all 0 (a reward read off the answer tied once: zero gradient, no new weights)
        return float(next(finished) % 2)

    rollout = TrlRollout(agent, collector, client, versions=versions, lag=lag)
    batches: list[tuple[list[tito.Sample], dict[str, tito.Call]]] = []
    handed: list[Any] = []  # the prompts TRL handed in at each call
    inner = rollout.run

    def recording(prompts: Any, n: int) -> Any:
        handed.append(prompts[0])
        out = inner(prompts, n)
        calls = {c.call_id: c for ep in rollout.last_episodes for c in ep.calls}
        batches.append((rollout.last_samples, calls))
        return out

    rollout.run = recording  # type: ignore[method-assign]
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "trainer"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-4,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        mask_truncated_completions=False,
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=load_policy(model_dir, "fp32"),
        reward_funcs=passthrough_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": QUESTIONS}),
        processing_class=load_tokenizer(model_dir),
        rollout_func=rollout,
    )
    engine = attach_engine(
        trainer, url, tmp_path / "weights", collector=collector, versions=versions
    )
    ratios = RatioProbe(trainer)
    try:
        trainer.train()
        rollout.close(client=True)
        collector.close()

        (update,) = engine.updates
        print(
            f"\nin-place update after step 1: {update.seconds:.2f} s, version "
            f"{update.previous!r} -> {update.version!r}; trainer vs rollout per batch: "
            + ", ".join(
                f"mean |log r| {b.mean_abs:.4f} on {b.tokens} tokens" for b in ratios.batches
            )
        )
        assert (update.previous, update.version) == ("0", "1")
        assert served.version() == "1"
        after = rescored_logprobs(url, name, probe_prompt)[1:]
        assert not np.array_equal(after, before)  # the engine scores with the new weights

        assert len(batches) == 2 and handed[0] != handed[1]  # one prompt per step
        for samples, calls in batches:  # trained tokens are the engine's own ids
            for sample in samples:
                for span in sample.spans:
                    sampled = calls[span.call_id].sampled_ids.tolist()
                    assert sample.token_ids[span.start : span.end].tolist() == sampled
        asked = [_question(url, batch[0][0]) for batch in batches]
        versions_of = [{s.policy_version for smp in b[0] for s in smp.spans} for b in batches]
        print(f"lag={lag}: versions per batch {versions_of}")
        assert asked[0] == handed[0] and versions_of[0] == {"0"}
        if lag == 0:
            assert asked[1] == handed[1] and versions_of[1] == {"1"}
        else:  # the first prompt again, sampled while step 1 trained: by "0" or "1", per span
            assert asked[1] == handed[0] and versions_of[1] <= {"0", "1"}
        by_version = {
            v: [smp for smp in batches[1][0] if smp.spans[0].policy_version == v] for v in "01"
        }
        for sample in by_version["1"]:  # exact against the new weights
            _assert_exact(url, name, sample)
        assert all(b.tokens > 0 for b in ratios.batches)
        assert "sampling/sampling_logp_difference/mean" in trainer.state.log_history[0]
    finally:
        rollout.close(client=True)
        served.update(model_dir, "e2e-restored")
    assert np.array_equal(rescored_logprobs(url, name, probe_prompt)[1:], before)
    for sample in by_version["0"]:  # async: sampled before the update, exact against the old
        _assert_exact(url, name, sample)


def _question(url: str, sample: tito.Sample) -> str:
    """The question a sample's episode was asked: the one whose rendered prompt it starts with."""
    context = sample.token_ids[: sample.spans[0].start].tolist()
    (asked,) = [q for q in QUESTIONS if context == tokenize(url, [{"role": "user", "content": q}])]
    return asked


def _assert_exact(url: str, name: str, sample: tito.Sample) -> None:
    exact = rescore_sample(url, name, sample)
    assert exact.tokens > 0
    assert exact.mean_abs <= MEAN_TOL and exact.max_abs <= MAX_TOL, exact

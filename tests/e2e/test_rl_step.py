"""End-to-end: one RL iteration on the real CPU vLLM (examples/rl_step.py, what `make rl-step` runs).

Round 1 against the session's dev-mode server (shared by the RL e2e tests); the trainer-side
model (transformers, fp32, the served weights) scores the tito samples through every converter
layout: on free-running tokens the importance ratio is 1 within fp32/bf16 noise (mean |log ratio|
<= 0.05) and not one trained token differs from the ids the engine sampled. The text pipeline is
run beside it (figures reported, not asserted: they depend on what was sampled). Then one GRPO
step, the new weights reloaded into that server in place (`VllmWeights.update`: seconds, where a
second vLLM took 1-2 minutes to start) and round 2: its spans carry the new policy_version and
are exact against the new weights, which explain them better than the old ones. The original
weights are put back after round 2.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch", reason="the trainer check needs torch (tito-agents[trainer-check])")
pytest.importorskip("transformers", reason="the trainer check needs transformers")

from tests.support.e2e_servers import VllmServers, dev_server_url, load_vllm_server_script
from tito_agents.trainer_check import LAYOUTS

# round 1, fp32 scoring on the CPU, a GRPO step, an in-place reload, round 2: 5.5 min on 2 cores
# at load average 6 with a second vLLM's start-up instead of the reload, 8.7-11.6 min at load
# 10-11 (docs/real-vllm.md, "The e2e tier")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
MEAN_TOL = 0.05


def _rl_step() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "tito_rl_step_example", ROOT / "examples/rl_step.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_one_rl_iteration_is_exact_and_round_trips(
    vllm_servers: VllmServers, tmp_path: Path
) -> None:
    rl_step = _rl_step()
    model_dir = Path(load_vllm_server_script().model_dir())
    dev_url = dev_server_url(vllm_servers)
    result = rl_step.run_loop(
        dev_url,
        model_dir,
        tmp_path,
        episodes=4,
        cities=2,
        max_tokens=(40, 32),
        dtypes=("fp32",),
        text_dtypes=("fp32",),
        reload_in_place=True,
    )
    comparison = result.comparison
    print("\n".join(comparison.headline()))

    assert {str(s.policy_version) for smp in result.round1.samples for s in smp.spans} == {"0"}
    layouts = comparison.tito["fp32"]
    assert set(layouts) == set(LAYOUTS)
    for layout, figures in layouts.items():
        assert figures.free.tokens > 0, layout
        assert figures.free.mean_abs <= MEAN_TOL, (layout, figures.free.line())
        assert figures.differing == 0, layout
        assert figures.trained_tokens == sum(s.num_trained for s in result.round1.samples)
    text = comparison.text["fp32"]
    assert text.trained_tokens > 0 and text.free.tokens > 0

    step = result.step
    assert step["tokens"] > 0 and step["changed_bf16"] > 0
    assert step["reload"] == "in-place"  # the dev-mode server reloaded, no second server
    assert (tmp_path / "policy-1" / "model.safetensors").is_file()

    round2 = result.round2
    assert round2 is not None and round2.samples
    assert {str(s.policy_version) for smp in round2.samples for s in smp.spans} == {"1"}
    exact = result.round2_check
    assert exact.free.tokens > 0
    assert exact.free.mean_abs <= MEAN_TOL, exact.free.line()
    assert exact.differing == 0
    old = comparison.extra["round2"]["fp32_pack_old_weights"]["free"]
    assert old["mean_abs"] > exact.free.mean_abs
    assert (tmp_path / "comparison.json").is_file()

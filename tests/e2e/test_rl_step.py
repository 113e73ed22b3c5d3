"""End-to-end: one RL iteration on the real CPU vLLM (examples/rl_step.py, what `make rl-step` runs).

Round 1 against the shared server; the trainer-side model (transformers, fp32, the served weights)
scores the tito samples through every converter layout: on free-running tokens the importance ratio
is 1 within fp32/bf16 noise (mean |log ratio| <= 0.05) and not one trained token differs from the
ids the engine sampled. The text pipeline is run beside it (figures reported, not asserted: they
depend on what was sampled). Then one GRPO step, the new weights served by a second vLLM (port
TITO_RL_RELOAD_PORT, default a free port, so that two runs on one machine never collide) and
round 2: its spans carry the new policy_version and are exact against the new weights, which
explain them better than the old ones. That second server serves weights made by this test, so it
is the test's own (started and stopped inside it, as `make rl-step` does).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("torch", reason="the trainer check needs torch (tito-agents[trainer-check])")
pytest.importorskip("transformers", reason="the trainer check needs transformers")

from tests.support.e2e_servers import free_port, load_vllm_server_script
from tito_agents.trainer_check import LAYOUTS

# round 1, fp32 scoring on the CPU, a GRPO step, a second vLLM's start-up, round 2: 5.5 min on
# 2 cores at load average 6, 8.7-11.6 min at load 10-11 (docs/real-vllm.md, "The e2e tier")
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


def test_one_rl_iteration_is_exact_and_round_trips(vllm_base_url: str, tmp_path: Path) -> None:
    rl_step = _rl_step()
    model_dir = Path(load_vllm_server_script().model_dir())
    result = rl_step.run_loop(
        vllm_base_url,
        model_dir,
        tmp_path,
        episodes=4,
        cities=2,
        max_tokens=(40, 32),
        dtypes=("fp32",),
        text_dtypes=("fp32",),
        reload_port=int(os.environ.get("TITO_RL_RELOAD_PORT") or free_port()),
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

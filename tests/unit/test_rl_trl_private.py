"""The TRL internals `tito_agents.rl.trl_engine` relies on, checked on the installed TRL.

TRL publishes no hook for a `rollout_func` against a vLLM of one's own with the importance-sampling
correction on, so `attach_engine` sets `GRPOTrainer` attributes and `RatioProbe` wraps one of its
methods. A TRL release that renames or stops reading one of them would leave training running
without the correction or the weight sync, silently: these tests fail instead, and
`SUPPORTED_TRL` refuses versions nobody checked."""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

import trl
from packaging.version import Version

from tito_agents.rl.trl_engine import (
    SUPPORTED_TRL,
    RatioProbe,
    UnsupportedTrl,
    attach_engine,
    check_trl_version,
)

GRPO_SOURCE = inspect.getsource(trl.GRPOTrainer)


def source(function: object) -> str:
    return " ".join(inspect.getsource(function).split())  # one line: immune to rewrapping


def test_the_installed_trl_is_a_supported_one() -> None:
    assert check_trl_version() == trl.__version__
    assert SUPPORTED_TRL.contains(Version(trl.__version__), prereleases=True)


@pytest.mark.parametrize("faked", ["1.15.2", "1.17.0", "1.17.0.dev0", "2.0.0"])
def test_attach_engine_refuses_an_unchecked_trl(
    monkeypatch: pytest.MonkeyPatch, faked: str
) -> None:
    monkeypatch.setattr(trl, "__version__", faked)
    with pytest.raises(UnsupportedTrl) as raised:
        attach_engine(object(), "http://x/v1", "w")
    assert f"TRL {faked} is installed" in str(raised.value)
    assert str(SUPPORTED_TRL) in str(raised.value)
    with pytest.raises(UnsupportedTrl):
        RatioProbe(object())


def test_a_dev_build_of_a_supported_release_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trl, "__version__", "1.16.1.dev0")
    assert check_trl_version() == "1.16.1.dev0"


def test_the_trainer_reads_the_attributes_attach_engine_sets() -> None:
    init = source(trl.GRPOTrainer.__init__)
    for line in (
        "self.use_vllm = args.use_vllm",
        "self.vllm_mode = args.vllm_mode",
        "self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction",
        "self._last_loaded_step = -1",
    ):
        assert line in init, line


def test_a_rollout_func_batch_syncs_through_vllm_generation_once_per_step() -> None:
    generate = source(trl.GRPOTrainer._generate)
    rollout = generate.index("if self.rollout_func is not None:")
    sync = generate.index(
        "if self.use_vllm and self.state.global_step != self._last_loaded_step:", rollout
    )
    assert generate.index("self.vllm_generation.sync_weights()", sync) > sync
    assert "self._last_loaded_step = self.state.global_step" in generate[sync:]
    assert generate.index("self.rollout_func(prompts, self)", sync) > sync


def test_the_stand_in_covers_what_the_trainer_calls_on_vllm_generation() -> None:
    """`EngineSync` answers `sync_weights` and `generate`; `llm` (colocate mode) and
    `vllm_client` (built in `__init__` only when `use_vllm` was on from the start) are never
    reached with `vllm_mode="server"` set after construction."""
    used = set(re.findall(r"self\.vllm_generation\.(\w+)", GRPO_SOURCE))
    assert used == {"sync_weights", "generate", "llm", "vllm_client"}
    from trl.generation.vllm_generation import VLLMGeneration

    assert list(inspect.signature(VLLMGeneration.sync_weights).parameters) == ["self"]
    assert re.search(
        r"self\.vllm_mode == \"colocate\"[^\n]*\n[^\n]*vllm_generation\.llm", GRPO_SOURCE
    )


def test_the_correction_and_ratio_probe_read_these_outputs() -> None:
    score = source(trl.GRPOTrainer._generate_and_score_completions)
    for key in (
        '"completion_mask": completion_mask',
        'output["old_per_token_logps"] = old_per_token_logps',
        'output["importance_sampling_ratio"] = vllm_importance_sampling_ratio',
        'output["sampling_per_token_logps"] = sampling_per_token_logps',
        'output["tool_mask"] = tool_mask',
        "self.use_vllm and self.vllm_importance_sampling_correction",
    ):
        assert key in score, key


@pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning")
def test_a_built_trainer_has_every_attribute_with_the_expected_shape(tmp_path: Path) -> None:
    from tests.support.trl_trainer import grpo_trainer
    from tito_agents.testing.smollm2 import load_tokenizer

    trainer = grpo_trainer(load_tokenizer(), tmp_path, lambda prompts, trainer: {})
    assert trainer.use_vllm is False
    assert trainer.vllm_mode in ("server", "colocate")
    assert isinstance(trainer.vllm_importance_sampling_correction, bool)
    assert not hasattr(trainer, "vllm_generation")  # attach_engine adds it
    assert not hasattr(trainer, "_last_loaded_step")
    assert isinstance(trainer.state.global_step, int)
    assert callable(trainer.rollout_func)
    for method in ("_generate", "_generate_and_score_completions"):
        assert inspect.ismethod(getattr(trainer, method)), method
    assert list(inspect.signature(trainer._generate_and_score_completions).parameters) == ["inputs"]
    assert trainer.accelerator.state.num_processes == 1
    assert isinstance(trainer.accelerator.state.is_main_process, bool)

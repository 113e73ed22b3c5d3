"""Make TRL's `GRPOTrainer` use the rollout logprobs of a `rollout_func` and sync a vLLM of yours.

    trainer = GRPOTrainer(..., rollout_func=TrlRollout(agent, collector, client))
    engine = attach_engine(trainer, VLLM_URL, "out/weights", collector=collector)
    probe = RatioProbe(trainer)          # optional: the log ratio of every generation batch
    trainer.train()

Why: TRL 1.16 takes the `logprobs` a `rollout_func` returns, but uses them (its importance-
sampling correction, `sampling/sampling_logp_difference` and `importance_sampling_ratio` metrics)
only when `use_vllm=True`, which also makes it build and drive a vLLM of its own. With a
`rollout_func` against your own server, TRL's `use_vllm` branches are (grpo_trainer.py, 1.16):
its own generation (skipped: the rollout_func replaces it), colocate-mode length checks (not
taken in "server" mode), `vllm_generation.sync_weights()` once per optimizer step before the
rollout_func is called, the old-policy forward pass and the importance ratio (what we want), and
the ratio in the loss. So `attach_engine` sets, after the trainer is built, `use_vllm=True`,
`vllm_mode="server"`, the correction on, and a stand-in `vllm_generation` (`EngineSync`) whose
`sync_weights()` pushes the trainer's weights into the running vLLM in place (`push_weights`) and
moves the collector's `policy_version` to the version the engine reports. It replaces
`WeightSyncCallback` (use one or the other).

TRL has no public hook for this (a `rollout_func` against a server of one's own, with its
importance-sampling correction on): `attach_engine` sets the trainer's attributes `use_vllm`,
`vllm_mode`, `vllm_importance_sampling_correction`, `vllm_generation` and `_last_loaded_step`,
and `RatioProbe` wraps `_generate_and_score_completions`. So the TRL versions these were read
against are pinned (`SUPPORTED_TRL`): `attach_engine` refuses another with `UnsupportedTrl`, and
`tests/unit/test_rl_trl_private.py` checks each of them on the installed TRL.

Several processes: every rank calls `sync_weights`; the weights are gathered as the trainer
shards them, written and pushed by the main process only, and every rank waits for the push
(`tito_agents.rl.sync`).

Its own module, imported by name: it needs TRL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tito_agents.collector import Collector
from tito_agents.errors import TitoError
from tito_agents.rl.sync import push_and_record, sharding
from tito_agents.rl.versions import VersionLog
from tito_agents.rl.weights import DEFAULT_TIMEOUT, PauseMode, WeightUpdate

SUPPORTED_TRL = SpecifierSet(">=1.16,<1.17")
"""The TRL versions whose `GRPOTrainer` internals `attach_engine` was checked against."""

CLIP = 0.2
"""PPO's clip range for `frac_outside_clip` (as `trainer_check.ratio_stats.CLIP`)."""


class UnsupportedTrl(TitoError):
    """The installed TRL is not one `attach_engine` was checked against (`SUPPORTED_TRL`): the
    private trainer attributes it sets may mean something else there, or nothing."""


def check_trl_version() -> str:
    """The installed TRL's version, or `UnsupportedTrl` when it is outside `SUPPORTED_TRL`."""
    import trl

    installed = str(trl.__version__)
    # a dev build of a supported release counts; "<1.17" still refuses 1.17's pre-releases
    if not SUPPORTED_TRL.contains(Version(installed), prereleases=True):
        raise UnsupportedTrl(
            f"TRL {installed} is installed; tito_agents.rl.trl_engine supports TRL "
            f"{SUPPORTED_TRL} (it sets GRPOTrainer attributes TRL does not publish): install "
            f'"trl{SUPPORTED_TRL}", or use WeightSyncCallback, which needs no TRL internals'
        )
    return installed


class EngineSync:
    """TRL's `vllm_generation` stand-in: `sync_weights()` serves the trainer's weights in place.

    The version pushed is the trainer's `global_step`. `updates` keeps every `WeightUpdate`;
    `versions` (a `VersionLog`) gets each one, to read calls' versions off it."""

    def __init__(
        self,
        trainer: Any,
        base_url: str,
        weights_dir: str | Path,
        *,
        collector: Collector | None = None,
        versions: VersionLog | None = None,
        dtype: str = "bfloat16",
        pause: PauseMode | None = "wait",
        timeout: float = DEFAULT_TIMEOUT,
        on_update: Callable[[WeightUpdate], None] | None = None,
    ) -> None:
        self.trainer = trainer
        self.base_url = base_url
        self.weights_dir = Path(weights_dir)
        self.collector = collector
        self.versions = versions
        self.dtype = dtype
        self.pause: PauseMode | None = pause
        self.timeout = timeout
        self.on_update = on_update
        self.updates: list[WeightUpdate] = []

    def sync_weights(self) -> None:
        """What TRL calls before each new generation batch (once per optimizer step), on every
        rank: the main process pushes, the others wait for it (`tito_agents.rl.sync`)."""
        trainer = self.trainer
        accelerator = trainer.accelerator
        processes = accelerator.state
        # FSDP gathers from the wrapped model (it owns the shards); the others from the module
        wrapped = sharding(processes) == "fsdp"
        model = trainer.model if wrapped else accelerator.unwrap_model(trainer.model)
        push_and_record(self, model, str(int(trainer.state.global_step)), processes)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "tito_agents.rl.EngineSync generates nothing: the trainer's rollout_func does"
        )


def attach_engine(
    trainer: Any,
    base_url: str,
    weights_dir: str | Path,
    *,
    collector: Collector | None = None,
    versions: VersionLog | None = None,
    importance_sampling: bool = True,
    pause: PauseMode | None = "wait",
    dtype: str = "bfloat16",
    on_update: Callable[[WeightUpdate], None] | None = None,
) -> EngineSync:
    """Turn on TRL's use of the rollout logprobs and weight sync into the vLLM at `base_url`
    (see the module docstring). The server is taken to serve the trainer's weights now (its
    first push happens before the second generation batch). Returns the `EngineSync`.

    Raises `UnsupportedTrl` when the installed TRL is outside `SUPPORTED_TRL`, `ValueError` when
    `trainer` is not a GRPOTrainer built with a `rollout_func`."""
    check_trl_version()
    if getattr(trainer, "rollout_func", None) is None:
        raise ValueError("attach_engine is for a GRPOTrainer built with rollout_func=...")
    if getattr(trainer, "use_vllm", False) and not isinstance(
        getattr(trainer, "vllm_generation", None), EngineSync
    ):
        raise ValueError("the trainer drives a vLLM of its own (use_vllm=True): nothing to attach")
    for name in ("vllm_importance_sampling_correction", "_generate", "state"):
        if not hasattr(trainer, name):
            raise ValueError(f"not a TRL GRPOTrainer: it has no {name!r}")
    engine = EngineSync(
        trainer,
        base_url,
        weights_dir,
        collector=collector,
        versions=versions,
        pause=pause,
        dtype=dtype,
        on_update=on_update,
    )
    trainer.use_vllm = True
    trainer.vllm_mode = "server"
    trainer.vllm_importance_sampling_correction = importance_sampling
    trainer.vllm_generation = engine
    trainer._last_loaded_step = int(trainer.state.global_step)
    return engine


@dataclass(slots=True)
class BatchRatio:
    """The trainer's log ratio (`old_per_token_logps - sampling logprobs`) on one generation
    batch's trained tokens (completion mask x env mask), rollout logprobs present."""

    tokens: int
    mean_abs: float
    max_abs: float
    outside_clip: int
    seconds: float
    """Wall time of TRL's `_generate_and_score_completions` (rollout, conversion, old-policy
    forward pass, rewards)."""
    rows: int = 0
    rows_downweighted: int = 0
    """Rows whose importance weight in TRL's loss is below 0.5 (TRL 1.16's default
    "sequence_mask" mode: exp of the row's summed log ratio, 0 beyond `clip_max`): rows the
    correction all but silences."""
    weight_mean: float = math.nan
    """Mean of TRL's per-row importance weight (sequence modes; NaN in token modes)."""

    @property
    def frac_outside_clip(self) -> float:
        return self.outside_clip / self.tokens if self.tokens else 0.0


@dataclass(slots=True)
class RatioProbe:
    """Records a `BatchRatio` per generation batch of `trainer` (in `batches`); needs TRL's
    old-policy logprobs, so `attach_engine` (importance sampling on) must be in place."""

    trainer: Any
    clip: float = CLIP
    batches: list[BatchRatio] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_trl_version()  # it wraps a TRL method that is not public
        inner = self.trainer._generate_and_score_completions

        def probed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            output = inner(*args, **kwargs)
            self.batches.append(batch_ratio(output, self.clip, time.perf_counter() - started))
            return output

        self.trainer._generate_and_score_completions = probed


def batch_ratio(output: dict[str, Any], clip: float = CLIP, seconds: float = 0.0) -> BatchRatio:
    """`BatchRatio` of one output of TRL's `_generate_and_score_completions`."""
    import torch

    old = output.get("old_per_token_logps")
    sampled = output.get("sampling_per_token_logps")
    if old is None or sampled is None:
        return BatchRatio(0, math.nan, math.nan, 0, seconds)
    mask = output["completion_mask"].bool()
    if "tool_mask" in output:
        mask &= output["tool_mask"].bool()
    diff = (old - sampled).detach().float()
    diff = diff[mask & ~torch.isnan(diff)]
    if diff.numel() == 0:
        return BatchRatio(0, math.nan, math.nan, 0, seconds)
    ratio = torch.exp(diff)
    outside = int(((ratio < 1 - clip) | (ratio > 1 + clip)).sum())
    weights = output.get("importance_sampling_ratio")
    rows = int(mask.shape[0])
    downweighted, weight_mean = 0, math.nan
    if weights is not None and weights.dim() == 2 and weights.shape[-1] == 1:
        flat = weights.detach().float().flatten()
        downweighted = int((flat < 0.5).sum())
        weight_mean = float(flat.mean())
    return BatchRatio(
        tokens=int(diff.numel()),
        mean_abs=float(diff.abs().mean()),
        max_abs=float(diff.abs().max()),
        outside_clip=outside,
        seconds=seconds,
        rows=rows,
        rows_downweighted=downweighted,
        weight_mean=weight_mean,
    )

"""A `transformers` trainer callback that serves every optimizer step's weights in place.

    trainer = GRPOTrainer(..., rollout_func=TrlRollout(agent, collector, client))
    sync = WeightSyncCallback(VLLM_URL, "out/weights", collector=collector)
    trainer.add_callback(sync)
    trainer.train()       # after each step: push_weights, then the collector's policy_version

TRL's `GRPOTrainer` syncs weights itself only into the vLLM it drives (`use_vllm=True`); with a
`rollout_func` against a server of your own, nothing tells that server about the step. At each
`on_step_end` (after the optimizer step, before the next generation batch is rolled out) this
callback writes the model's weights, has the running vLLM reload them in place and label them with
the trainer's `global_step` (`tito_agents.rl.weights`), then moves the collector's
`policy_version` to the version the engine reports, so the next samples carry it.

Several processes: every rank's callback runs; the weights are gathered as the trainer shards
them, written and pushed by the main process only, and every rank waits for the push
(`tito_agents.rl.sync`). The callback is handed the model the trainer was built with, which FSDP1
wraps from outside: under FSDP1 prefer `trl_engine.attach_engine`, which reads the wrapped one.

Its own module, imported by name: it needs `transformers`, which the rest of the package does not.
A PEFT model must be merged before saving (not done here).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tito_agents.collector import Collector
from tito_agents.rl.sync import Processes, push_and_record
from tito_agents.rl.versions import VersionLog
from tito_agents.rl.weights import DEFAULT_TIMEOUT, PauseMode, WeightUpdate


class WeightSyncCallback(TrainerCallback):
    """Push the weights into the vLLM at `base_url` after every optimizer step.

    weights_dir: the folder the weights are written to (overwritten each step; /dev/shm keeps the
        write off the disk). collector: its `policy_version` follows the engine's version.
    versions: a `VersionLog` that records every update (for `TrlRollout(versions=...)`).
    every: push every `every` steps (the step's version still labels the weights served).
    on_update: called with each `WeightUpdate` (to log it); all are kept in `updates`.
    processes: the trainer's processes (its `accelerator.state`); by default accelerate's shared
        `AcceleratorState`, which the trainer set up.
    """

    def __init__(
        self,
        base_url: str,
        weights_dir: str | Path,
        *,
        collector: Collector | None = None,
        versions: VersionLog | None = None,
        every: int = 1,
        dtype: str = "bfloat16",
        pause: PauseMode | None = "wait",
        timeout: float = DEFAULT_TIMEOUT,
        on_update: Callable[[WeightUpdate], None] | None = None,
        processes: Processes | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.base_url = base_url
        self.weights_dir = Path(weights_dir)
        self.collector = collector
        self.versions = versions
        self.every = every
        self.dtype = dtype
        self.pause: PauseMode | None = pause
        self.timeout = timeout
        self.on_update = on_update
        self.processes = processes
        self.updates: list[WeightUpdate] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        if step % self.every:
            return
        model = kwargs.get("model")
        if model is None:
            raise ValueError("the trainer passed no model to its callback")
        processes = self.processes if self.processes is not None else _trainer_processes()
        push_and_record(self, model, str(step), processes)


def _trainer_processes() -> Processes:
    """accelerate's shared state, set up by the trainer's `Accelerator` (a callback is handed
    neither the trainer nor its accelerator)."""
    from accelerate.state import AcceleratorState  # type: ignore[import-untyped]

    return AcceleratorState()  # type: ignore[no-any-return]

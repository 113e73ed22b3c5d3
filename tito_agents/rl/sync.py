"""One weight push after a trainer's step, from one process or several (DeepSpeed, FSDP, DDP).

`push_and_record` is the step both TRL paths take (`trl_engine.EngineSync`, `WeightSyncCallback`).
Every rank runs the trainer's step and its own rollouts, but the vLLM server takes one folder of
weights. So a push goes, on every rank, in the same order:

1. gather the full weights the way the trainer shards them (a collective: every rank takes part)
   - DeepSpeed ZeRO-3: each parameter in turn under `deepspeed.zero.GatheredParameters`, as TRL's
     own vLLM sync does (`trl/generation/vllm_generation.py`), so only one full parameter is
     materialised at a time;
   - FSDP (1 or 2): torch's full state dict, offloaded to the CPU of rank 0
     (`get_model_state_dict(full_state_dict=True, cpu_offload=True)`);
   - otherwise (one process, DDP, ZeRO-1/2): the unwrapped model's own `state_dict()`;
2. the main process alone writes the folder and has the server reload it (`push_weights`);
3. every rank waits at a barrier (`wait_for_everyone`), so none starts its next rollout before
   the server serves the new weights;
4. the main process's outcome goes to every rank (`broadcast_object_list`): each records the
   same `WeightUpdate` (its collector's `policy_version` follows it), or raises the same failure,
   so a failed push stops every rank instead of leaving the others waiting at the next collective.

`processes` is accelerate's `AcceleratorState` (`trainer.accelerator.state`); only what
`Processes` names is read, so tests fake it. Not run on several GPUs here: the replicated and
FSDP2 paths run on two CPU processes (gloo) in the tests, ZeRO-3 and FSDP1 only with fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from tito_agents.rl.weights import PauseMode, WeightSyncError, WeightUpdate, push_weights

if TYPE_CHECKING:
    from tito_agents.collector import Collector
    from tito_agents.rl.versions import VersionLog

Sharding = Literal["zero3", "fsdp", "none"]


class Processes(Protocol):
    """What a push reads of accelerate's `AcceleratorState` (its `deepspeed_plugin` and
    `fsdp_plugin` are read with `getattr`, as TRL's `DistributedBackend` does)."""

    @property
    def is_main_process(self) -> bool: ...

    @property
    def num_processes(self) -> int: ...

    def wait_for_everyone(self) -> None: ...


class WeightPusher(Protocol):
    """What `push_and_record` reads of its owner (`WeightSyncCallback`, `trl_engine.EngineSync`)."""

    base_url: str
    weights_dir: Path
    collector: Collector | None
    versions: VersionLog | None
    dtype: str
    pause: PauseMode | None
    timeout: float
    on_update: Callable[[WeightUpdate], None] | None
    updates: list[WeightUpdate]


def push_and_record(
    owner: WeightPusher, model: Any, version: str, processes: Processes
) -> WeightUpdate:
    """Serve `model`'s weights in place as `version` (gathered, pushed from the main process:
    `push_from_main`), then tell everyone who follows versions, on every rank: the collector's
    `policy_version` (the engine's answer), the `VersionLog`, the owner's `updates` and its
    `on_update` hook."""

    def push(state: Mapping[str, Any]) -> WeightUpdate:
        return push_weights(
            state,
            owner.base_url,
            owner.weights_dir,
            version=version,
            dtype=owner.dtype,
            pause=owner.pause,
            timeout=owner.timeout,
        )

    update = push_from_main(processes, model, push)
    if owner.collector is not None:
        owner.collector.settings.policy_version = update.version
    if owner.versions is not None:
        owner.versions.record(update)
    owner.updates.append(update)
    if owner.on_update is not None:
        owner.on_update(update)
    return update


def sharding(processes: Processes) -> Sharding:
    """How the trainer's parameters are split across processes."""
    deepspeed = getattr(processes, "deepspeed_plugin", None)
    if deepspeed is not None and getattr(deepspeed, "zero_stage", 0) == 3:
        return "zero3"
    if getattr(processes, "fsdp_plugin", None) is not None:
        return "fsdp"
    return "none"


def full_state(model: Any, processes: Processes) -> Mapping[str, Any] | None:
    """The model's full weights on the main process, None on the others. Every rank must call it
    (gathering is a collective). `model`: the unwrapped model under ZeRO-3 and without
    sharding, the FSDP-wrapped one under FSDP."""
    main = processes.is_main_process
    kind = sharding(processes)
    if kind == "zero3":
        return _zero3_state(model, main)
    if kind == "fsdp":
        return _fsdp_state(model, main)
    return model.state_dict() if main else None


def _zero3_state(model: Any, main: bool) -> dict[str, Any] | None:
    import deepspeed  # type: ignore[import-not-found]  # present where ZeRO-3 runs

    state: dict[str, Any] = {}
    for name, param in model.named_parameters():  # tied weights come once
        with deepspeed.zero.GatheredParameters([param]):
            if main:
                state[name] = param.data.detach().cpu()
    if not main:
        return None
    parameters = dict(model.named_parameters(remove_duplicate=False))
    for name, tensor in model.state_dict().items():  # persistent buffers: never partitioned
        if name not in parameters:
            state[name] = tensor.detach().cpu()
    return state


def _fsdp_state(model: Any, main: bool) -> dict[str, Any] | None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)  # full on rank 0, empty elsewhere
    return dict(state) if main else None


def push_from_main(
    processes: Processes,
    model: Any,
    push: Callable[[Mapping[str, Any]], WeightUpdate],
) -> WeightUpdate:
    """Gather `model`, `push` its full state from the main process, wait for every rank, and
    return the main process's `WeightUpdate` on every rank (see the module docstring)."""
    state = full_state(model, processes)
    update: WeightUpdate | None = None
    failure: BaseException | None = None
    if state is not None:
        try:
            update = push(state)
        except BaseException as exc:  # the other ranks must hear of it, not hang
            failure = exc
    processes.wait_for_everyone()
    outcome = _from_main(processes, update if failure is None else f"{failure}")
    if failure is not None:
        raise failure
    if isinstance(outcome, str):
        raise WeightSyncError(f"the main process's weight push failed: {outcome}")
    if outcome is None:
        raise WeightSyncError("the main process sent no weight update")
    return outcome


def _from_main(
    processes: Processes, outcome: WeightUpdate | str | None
) -> WeightUpdate | str | None:
    """The main process's `outcome`, on every rank."""
    if processes.num_processes <= 1:
        return outcome
    from accelerate.utils import broadcast_object_list  # type: ignore[import-untyped]

    box: list[Any] = [outcome]
    broadcast_object_list(box, from_process=0)
    outcome = box[0]
    return outcome

"""`tito_agents.rl.sync` on several processes, faked: no GPU, no deepspeed, no process group.

Each rank is played in turn by a `FakeProcesses` (what the sync reads of accelerate's
`AcceleratorState`), the main process's broadcast by a stand-in that hands every rank the main
process's answer. Checked: the gather path the trainer's sharding calls for (ZeRO-3: one
`GatheredParameters` per parameter; FSDP: torch's full state dict offloaded to CPU; otherwise the
module's `state_dict`), only the main process writes and pushes, every rank reaches the barrier
and records the main process's `WeightUpdate`, a failed push stops every rank."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import tito_agents as tito
from tests.support.vllm_dev_routes import DevRoutes
from tito_agents.rl import VersionLog, WeightSyncError, WeightUpdate
from tito_agents.rl.sync import full_state, push_from_main, sharding

torch = pytest.importorskip("torch")


@dataclass
class FakeProcesses:
    """One rank's view of accelerate's `AcceleratorState`."""

    is_main_process: bool = True
    num_processes: int = 2
    deepspeed_plugin: Any = None
    fsdp_plugin: Any = None
    barriers: int = 0

    def wait_for_everyone(self) -> None:
        self.barriers += 1


def rank(index: int, **plugins: Any) -> FakeProcesses:
    return FakeProcesses(is_main_process=index == 0, **plugins)


def zero(stage: int) -> Any:
    return types.SimpleNamespace(zero_stage=stage)


class Tiny(torch.nn.Module):
    """Two layers, the second tied to the first, and a persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(3, 3, bias=False)
        self.head = torch.nn.Linear(3, 3, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(3))


@dataclass
class Broadcast:
    """`accelerate.utils.broadcast_object_list` across the played ranks: the main process's
    object (the first one sent) is what every later rank receives."""

    sent: list[Any] = field(default_factory=list)

    def __call__(self, box: list[Any], from_process: int = 0) -> list[Any]:
        assert from_process == 0
        self.sent.append(box[0])
        box[0] = self.sent[0]
        return box


@pytest.fixture
def broadcast(monkeypatch: pytest.MonkeyPatch) -> Broadcast:
    import accelerate.utils

    fake = Broadcast()
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", fake)
    return fake


@pytest.fixture
def gathered(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    """A `deepspeed` module whose `zero.GatheredParameters` records what each use gathers."""
    calls: list[list[Any]] = []

    @contextmanager
    def gathered_parameters(params: list[Any]) -> Iterator[None]:
        calls.append(list(params))
        yield

    fake = types.ModuleType("deepspeed")
    fake.zero = types.SimpleNamespace(GatheredParameters=gathered_parameters)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    return calls


@pytest.fixture
def fsdp_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """torch's `get_model_state_dict`, recording its options; full on rank 0 only, as torch's."""
    import torch.distributed.checkpoint.state_dict as dcp_state

    calls: list[Any] = []

    def get_model_state_dict(model: Any, *, options: Any) -> dict[str, Any]:
        calls.append(options)
        return {"full.weight": torch.zeros(2)} if len(calls) == 1 else {}

    monkeypatch.setattr(dcp_state, "get_model_state_dict", get_model_state_dict)
    return calls


def test_sharding_reads_the_plugins_as_trl_does() -> None:
    assert sharding(FakeProcesses(deepspeed_plugin=zero(3))) == "zero3"
    assert sharding(FakeProcesses(deepspeed_plugin=zero(2))) == "none"
    assert sharding(FakeProcesses(fsdp_plugin=object())) == "fsdp"
    assert sharding(FakeProcesses()) == "none"


def test_zero3_gathers_each_parameter_and_only_the_main_process_keeps_them(
    gathered: list[list[Any]],
) -> None:
    model = Tiny()
    main = full_state(model, rank(0, deepspeed_plugin=zero(3)))
    assert [len(params) for params in gathered] == [1]  # the tied weight once
    assert gathered[0][0] is model.embed.weight
    assert main is not None and sorted(main) == ["embed.weight", "scale"]
    assert torch.equal(main["embed.weight"], model.embed.weight.detach())
    assert full_state(model, rank(1, deepspeed_plugin=zero(3))) is None
    assert len(gathered) == 2  # rank 1 took part in the gather all the same


def test_fsdp_takes_the_full_state_dict_offloaded_to_cpu(
    gathered: list[list[Any]], fsdp_calls: list[Any]
) -> None:
    main = full_state(Tiny(), rank(0, fsdp_plugin=object()))
    other = full_state(Tiny(), rank(1, fsdp_plugin=object()))
    assert main is not None and list(main) == ["full.weight"] and other is None
    assert len(fsdp_calls) == 2  # a collective: both ranks call it
    assert all(o.full_state_dict and o.cpu_offload for o in fsdp_calls)
    assert gathered == []


def test_without_sharding_the_main_process_reads_the_module(
    gathered: list[list[Any]], fsdp_calls: list[Any]
) -> None:
    model = Tiny()
    main = full_state(model, rank(0))
    assert main is not None and list(main) == list(model.state_dict())
    assert full_state(model, rank(1)) is None
    assert gathered == [] and fsdp_calls == []


def update(version: str) -> WeightUpdate:
    return WeightUpdate(
        version, "0", Path("/w"), 0.1, 0.2, "wait", paused_at=1.0, drained_at=2.0, resumed_at=3.0
    )


def test_only_the_main_process_pushes_every_rank_waits_and_gets_its_update(
    broadcast: Broadcast,
) -> None:
    pushed: list[Any] = []

    def push(state: Any) -> WeightUpdate:
        pushed.append(state)
        return update("1")

    ranks = [rank(0), rank(1), rank(2)]
    results = [push_from_main(r, Tiny(), push) for r in ranks]
    assert len(pushed) == 1
    assert [r.barriers for r in ranks] == [1, 1, 1]
    assert [u.version for u in results] == ["1", "1", "1"]
    assert broadcast.sent[1:] == [None, None]  # the others send nothing of their own


def test_a_failed_push_stops_every_rank(broadcast: Broadcast) -> None:
    def push(state: Any) -> WeightUpdate:
        raise WeightSyncError("reload_weights answered 500")

    main, other = rank(0), rank(1)
    with pytest.raises(WeightSyncError, match="answered 500") as raised:
        push_from_main(main, Tiny(), push)
    assert "main process" not in str(raised.value)  # the main process raises its own error
    with pytest.raises(WeightSyncError, match=r"main process's weight push failed: .*500"):
        push_from_main(other, Tiny(), push)
    assert (main.barriers, other.barriers) == (1, 1)


def test_one_process_broadcasts_nothing(broadcast: Broadcast) -> None:
    alone = FakeProcesses(num_processes=1)
    assert push_from_main(alone, Tiny(), lambda state: update("3")).version == "3"
    assert alone.barriers == 1 and broadcast.sent == []


def fake_trainer(processes: FakeProcesses, step: int = 4) -> Any:
    """What `EngineSync.sync_weights` reads of a GRPOTrainer: its accelerator (state,
    unwrap_model), model and global step."""
    wrapped = types.SimpleNamespace(module=Tiny())
    unwrapped: list[Any] = []

    def unwrap_model(model: Any) -> Any:
        unwrapped.append(model)
        return model.module

    accelerator = types.SimpleNamespace(state=processes, unwrap_model=unwrap_model)
    return types.SimpleNamespace(
        accelerator=accelerator,
        model=wrapped,
        state=types.SimpleNamespace(global_step=step),
        unwrapped=unwrapped,
    )


def test_engine_sync_writes_once_from_rank_0_and_every_rank_follows(
    tmp_path: Path, broadcast: Broadcast
) -> None:
    from tito_agents.rl.trl_engine import EngineSync

    with DevRoutes() as routes:
        engines = []
        for index in (0, 1):
            collector = tito.Collector(policy_version="0")
            engine = EngineSync(
                fake_trainer(rank(index)),
                routes.url,
                tmp_path / f"weights{index}",
                collector=collector,
                versions=VersionLog(initial="0"),
            )
            engine.sync_weights()
            engines.append(engine)
            collector.close()
    assert routes.reloads() == [str((tmp_path / "weights0").resolve())]
    assert (tmp_path / "weights0" / "model.safetensors").is_file()
    assert not (tmp_path / "weights1").exists()
    for engine in engines:
        assert [u.version for u in engine.updates] == ["4"]
        assert engine.collector is not None and engine.collector.settings.policy_version == "4"
        assert engine.versions is not None and engine.versions.current == "4"
        assert engine.trainer.accelerator.state.barriers == 1
        assert len(engine.trainer.unwrapped) == 1


def test_engine_sync_gathers_the_wrapped_model_under_fsdp(
    tmp_path: Path, broadcast: Broadcast, fsdp_calls: list[Any]
) -> None:
    from tito_agents.rl.trl_engine import EngineSync

    trainer = fake_trainer(rank(1, fsdp_plugin=object()))
    broadcast.sent.append(update("4"))  # rank 0's answer, already sent
    engine = EngineSync(trainer, "http://unused.test/v1", tmp_path / "weights")
    engine.sync_weights()
    assert trainer.unwrapped == [] and len(fsdp_calls) == 1
    assert [u.version for u in engine.updates] == ["4"]


def test_callback_on_rank_1_writes_nothing_and_records_rank_0s_update(
    tmp_path: Path, broadcast: Broadcast
) -> None:
    pytest.importorskip("transformers")
    from tito_agents.rl.trl_callback import WeightSyncCallback

    other = rank(1)
    broadcast.sent.append(update("2"))
    log = VersionLog(initial="0")
    sync = WeightSyncCallback(
        "http://unused.test/v1", tmp_path / "weights", versions=log, processes=other
    )
    sync.on_step_end(None, types.SimpleNamespace(global_step=2), None, model=Tiny())
    assert not (tmp_path / "weights").exists()
    assert other.barriers == 1 and log.current == "2" and sync.updates == [update("2")]

"""`WeightSyncCallback` on two real processes (CPU, gloo; accelerate's `PartialState`): replicated
weights (as under DDP), then FSDP2-sharded ones gathered by torch's full state dict. Only rank 0
writes its folder and reloads the (played) server; both ranks pass the barrier, receive rank 0's
`WeightUpdate` over the real broadcast and label their collector with it. DeepSpeed ZeRO-3 is not
installed here: its path is tested with fakes in tests/unit/test_rl_sync.py."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.support.vllm_dev_routes import DevRoutes

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")


class Ranks:
    """accelerate's `PartialState`, with the FSDP plugin an `Accelerator` would put next to it."""

    def __init__(self, state: Any, fsdp: bool) -> None:
        self.state = state
        self.fsdp_plugin = object() if fsdp else None

    @property
    def is_main_process(self) -> bool:
        return bool(self.state.is_main_process)

    @property
    def num_processes(self) -> int:
        return int(self.state.num_processes)

    def wait_for_everyone(self) -> None:
        self.state.wait_for_everyone()


def model() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))


def worker(rank: int, port: int, url: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
    )
    from accelerate.state import PartialState
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import tito_agents as tito
    from tito_agents.rl.trl_callback import WeightSyncCallback

    state = PartialState(cpu=True, backend="gloo")
    collector = tito.Collector(policy_version="0")
    folder = Path(out) / f"weights{rank}"
    report: dict[str, Any] = {}
    replicated, sharded = model(), model()
    mesh = init_device_mesh("cpu", (2,))
    for layer in sharded:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    for step, (net, fsdp) in enumerate([(replicated, False), (sharded, True)], start=1):
        sync = WeightSyncCallback(url, folder, collector=collector, processes=Ranks(state, fsdp))
        sync.on_step_end(None, _Step(step), None, model=net)
        report[str(step)] = {
            "updates": [u.version for u in sync.updates],
            "policy_version": collector.settings.policy_version,
            "wrote": (folder / "model.safetensors").is_file(),
        }
    collector.close()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


class _Step:
    def __init__(self, step: int) -> None:
        self.global_step = step


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_ranks_push_once_from_rank_0_replicated_then_fsdp_sharded(tmp_path: Path) -> None:
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    with DevRoutes() as routes:
        mp.spawn(worker, args=(free_port(), routes.url, str(tmp_path)), nprocs=2)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert routes.reloads() == [str((tmp_path / "weights0").resolve())] * 2
    assert not (tmp_path / "weights1").exists()
    for rank, report in enumerate(reports):
        assert report["1"] == {"updates": ["1"], "policy_version": "1", "wrote": rank == 0}
        assert report["2"] == {"updates": ["2"], "policy_version": "2", "wrote": rank == 0}
    written = load_file(
        str(tmp_path / "weights0" / "model.safetensors")
    )  # the gathered FSDP2 weights
    expected = {k: v.to(torch.bfloat16) for k, v in model().state_dict().items()}
    assert sorted(written) == sorted(expected)
    assert all(torch.equal(written[k], expected[k]) for k in expected)

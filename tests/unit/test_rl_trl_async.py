"""What `tito_agents.rl.TitoRolloutWorker` relies on in TRL 1.16's AsyncGRPO, checked on the
installed TRL, and the worker's own refusals.

`AsyncGRPOTrainer(rollout_worker=...)` is TRL's injection point: the worker must have the shape of
`RolloutWorkerProtocol` and put `RolloutSample`s on its queue. A TRL release that changes either
(a new protocol member, a renamed sample field, another use of the worker by the trainer) would
leave the trainer calling what the worker lacks: these tests fail instead, and `start` refuses
versions outside `SUPPORTED_TRL`."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from typing import Any, get_type_hints

import numpy as np
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="trl is not installed (pip install trl)")

import trl
from trl.experimental.async_grpo import async_grpo_trainer, async_rollout_worker

import tito_agents as tito
from tito_agents.convert.trl import TrlRolloutSampleFields
from tito_agents.errors import ConfigurationError
from tito_agents.rl import TitoRolloutWorker
from tito_agents.rl.trl_async import group_advantages
from tito_agents.rl.trl_engine import SUPPORTED_TRL, UnsupportedTrl

PROTOCOL = async_grpo_trainer.RolloutWorkerProtocol
TRAINER_SOURCE = " ".join(inspect.getsource(async_grpo_trainer).split())


async def agent(prompt: Any, client: Any) -> float:
    return 0.0


def worker(**kw: Any) -> TitoRolloutWorker:
    settings = {"capture_logprobs": True, "assembly": "merged", **kw.pop("collector", {})}
    collector = tito.Collector(**settings)
    kw.setdefault("num_generations", 2)
    return TitoRolloutWorker(agent, collector, None, [{"prompt": "p"}], **kw)


def test_the_installed_trl_is_the_pinned_one() -> None:
    assert trl.__version__ in SUPPORTED_TRL


def test_the_worker_has_every_member_of_trls_protocol() -> None:
    """The protocol's attributes and methods, with the same parameter names."""
    members = {
        name
        for name in vars(PROTOCOL)
        if not name.startswith("_") and callable(getattr(PROTOCOL, name))
    }
    assert members == {"start", "stop", "update_model_version", "check_health"}
    assert set(PROTOCOL.__annotations__) == {"rollout_buffer", "metrics_queue"}
    ours = worker()
    for name in PROTOCOL.__annotations__:
        assert hasattr(ours, name)
    for name in members:
        theirs = list(inspect.signature(getattr(PROTOCOL, name)).parameters)
        assert list(inspect.signature(getattr(TitoRolloutWorker, name)).parameters) == theirs


def test_the_trainer_takes_an_injected_worker_and_uses_only_the_protocol() -> None:
    """`rollout_worker=` replaces TRL's own worker; the trainer touches the worker through the
    protocol's members, except `_loop_kwargs` behind an `isinstance(AsyncRolloutWorker)` check
    (its resume state), which a worker of ours never meets."""
    assert "rollout_worker" in inspect.signature(async_grpo_trainer.AsyncGRPOTrainer).parameters
    assert "if rollout_worker is not None: # Use the injected worker" in TRAINER_SOURCE
    used = set(re.findall(r"rollout_worker\.(\w+)", TRAINER_SOURCE))
    assert used == {
        "start",
        "stop",
        "update_model_version",
        "check_health",
        "rollout_buffer",
        "metrics_queue",
        "_loop_kwargs",
    }
    assert TRAINER_SOURCE.count("isinstance(self.rollout_worker, AsyncRolloutWorker)") == 2


def test_rollout_sample_has_the_fields_we_fill() -> None:
    fields = {f.name for f in dataclasses.fields(async_rollout_worker.RolloutSample)}
    assert fields == set(get_type_hints(TrlRolloutSampleFields)) | {"enqueued_at"}


def test_advantages_are_trls_group_normalisation() -> None:
    """TRL's worker: `(r - mean) / (std + 1e-8)` over the scored rewards, 0 for NaN."""
    assert "(scored - scored.mean()) / (scored.std() + 1e-8)" in " ".join(
        inspect.getsource(async_rollout_worker).split()
    )
    rewards = np.array([1.0, np.nan, 3.0, 2.0])
    scored = np.array([1.0, 3.0, 2.0])
    expected = (scored - scored.mean()) / (scored.std() + 1e-8)
    assert group_advantages(rewards).tolist() == pytest.approx(
        [expected[0], 0.0, expected[1], expected[2]]
    )
    assert group_advantages(np.array([0.5, 0.5, 0.5])).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages(np.array([np.nan, np.nan])).tolist() == [0.0, 0.0]


def test_start_refuses_an_unsupported_trl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    ours = worker()
    with pytest.raises(UnsupportedTrl, match=r"1\.17\.0"):
        ours.start()
    assert not ours.wait_done(0)  # nothing was started


def test_update_model_version_labels_the_collector() -> None:
    ours = worker()
    ours.update_model_version(7)
    assert ours.model_version == 7
    assert ours.collector.settings.policy_version == "7"


@pytest.mark.parametrize(
    ("kw", "error", "match"),
    [
        ({"collector": {"assembly": "per_call"}}, ConfigurationError, "assembly='merged'"),
        ({"collector": {"capture_logprobs": False}}, ConfigurationError, "capture_logprobs"),
        ({"num_generations": 0}, ValueError, "num_generations"),
        ({"max_inflight_groups": 0}, ValueError, "max_inflight_groups"),
        ({"epochs": 0}, ValueError, "epochs"),
        ({"linked": "merge"}, ValueError, "linked"),
    ],
)
def test_misconfiguration_is_refused_up_front(kw: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        worker(**kw)

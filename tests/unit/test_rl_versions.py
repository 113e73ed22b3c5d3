"""`tito_agents.rl.versions`: each call's engine versions read off the updates' times (a "wait"
update drains, a "keep" update freezes calls mid-generation), spans relabelled with them, and the
`max_staleness` filter (mask or drop)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.rl_versions import call, sample, update
from tito_agents.rl import VersionLog, WeightUpdate, filter_stale, relabel
from tito_agents.rl.versions import version_number


def test_a_wait_update_drains_so_no_call_straddles() -> None:
    log = VersionLog(initial="0")
    log.record(update("1", "wait", paused=10.0, drained=12.0, resumed=13.0))
    assert log.current == "1"
    before = log.of_call(call("a", 1.0, 5.0))
    drained = log.of_call(call("b", 9.0, 11.5))  # in flight at the pause: finished on the old
    held = log.of_call(call("c", 11.0, 20.0))  # sent during the pause: held, sampled by the new
    after = log.of_call(call("d", 14.0, 20.0, label="1"))
    assert (before.dispatch, before.completion) == ("0", "0")
    assert (drained.dispatch, drained.completion) == ("0", "0")
    assert (held.dispatch, held.completion, held.straddles) == ("1", "1", False)
    assert held.mislabelled  # the collector still said "0" when it was sent
    assert (after.dispatch, after.completion, after.mislabelled) == ("1", "1", False)


def test_a_keep_update_freezes_calls_in_flight_which_then_straddle() -> None:
    log = VersionLog(initial="0")
    log.record(update("1", "keep", paused=10.0, drained=10.1, resumed=11.0))
    frozen = log.of_call(call("a", 9.0, 15.0))
    assert (frozen.dispatch, frozen.completion, frozen.straddles) == ("0", "1", True)
    assert not log.of_call(call("b", 12.0, 15.0)).straddles
    # relabelled spans carry the oldest version that sampled them
    relabelled = relabel(sample(["0", "0"]), {"c1": log.of_call(call("c1", 12.0, 13.0))})
    assert [s.policy_version for s in relabelled.spans] == ["0", "1"]


def test_an_update_without_times_is_refused() -> None:
    plain = WeightUpdate(
        version="1", previous="0", weights_path=Path("w"), save_s=0.0, reload_s=0.0
    )
    with pytest.raises(ValueError, match="no times"):
        VersionLog().record(plain)


def test_stale_spans_are_masked_or_their_sample_dropped() -> None:
    fresh, mixed, old = sample(["3", "3"]), sample(["1", "3"]), sample(["1", None])
    kept, report = filter_stale([fresh, mixed, old], current="3", max_staleness=1)
    assert len(kept) == 3
    assert kept[0] is fresh
    assert kept[1].loss_mask.tolist() == [0] * 5 + [0, 0, 1, 1, 1]
    assert mixed.loss_mask[2:5].tolist() == [1, 1, 1]  # the input is left as it was
    assert kept[2].loss_mask.tolist()[2:5] == [0, 0, 0] and kept[2].num_trained == 3
    assert (report.masked_tokens, report.stale_spans, report.unversioned_spans) == (6, 2, 1)

    kept, report = filter_stale([fresh, mixed, old], current=3, max_staleness=2)
    assert kept == [fresh, mixed, old] and report.masked_tokens == 0
    kept, report = filter_stale([fresh, mixed, old], current=3, max_staleness=0, mode="drop")
    assert kept == [fresh] and report.dropped_samples == 2


def test_staleness_needs_step_numbers() -> None:
    assert version_number("12") == 12 and version_number("v2") is None
    with pytest.raises(ValueError, match="not a step number"):
        filter_stale([sample(["1"])], current="latest", max_staleness=1)
    with pytest.raises(ValueError, match=">= 0"):
        filter_stale([sample(["1"])], current=1, max_staleness=-1)

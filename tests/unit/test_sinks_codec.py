"""The binary sample frame, the duplicate filter and the spill log."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tito_agents.errors import SampleFormatError
from tito_agents.samples import Sample
from tito_agents.sinks.codec import decode_frame, encode_frame
from tito_agents.sinks.dedupe import SampleDeduper
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.spill import SpillLog, iter_spill_file


def assert_same(a: Sample, b: Sample) -> None:
    assert a.to_dict().keys() == b.to_dict().keys()
    for key, value in a.to_dict().items():
        other = b.to_dict()[key]
        if isinstance(value, np.ndarray):
            assert isinstance(other, np.ndarray) and other.dtype == value.dtype
            assert np.array_equal(value, other), key
        else:
            assert value == other, key


@pytest.mark.parametrize("logprobs", [True, False])
def test_frame_roundtrip_is_exact(logprobs: bool) -> None:
    """Every field, array dtype and value survives encode_frame/decode_frame."""
    sample = synthetic_sample(7, 1000, logprobs=logprobs)
    sample.metadata = {"nested": {"a": [1, 2]}, "text": "é"}
    back = decode_frame(encode_frame(sample))
    assert_same(sample, back)
    assert back.token_ids.flags.writeable and back.token_ids.dtype == np.int32


def test_frame_costs_about_nine_bytes_per_token() -> None:
    """A long sample's frame is its raw arrays plus a small header, never JSON lists."""
    sample = synthetic_sample(1, 65536)
    assert len(encode_frame(sample)) < 9 * 65536 + 1024


def test_damaged_frames_are_refused() -> None:
    """A truncated or foreign frame raises SampleFormatError rather than yielding a bad sample."""
    frame = encode_frame(synthetic_sample(1, 100))
    with pytest.raises(SampleFormatError):
        decode_frame(frame[:-3])
    with pytest.raises(SampleFormatError):
        decode_frame(b"JSON" + frame[4:])


def test_deduper_drops_repeats_within_its_window() -> None:
    """An id seen within the window is a duplicate; memory stays at the window size."""
    dedupe = SampleDeduper(window=3)
    assert [dedupe.first_time(x) for x in "abca"] == [True, True, True, False]
    assert dedupe.first_time("d") and len(dedupe) == 3
    assert dedupe.duplicates == 1


def test_spill_log_replays_in_order_and_deletes_replayed_segments(tmp_path: Path) -> None:
    """Spilled samples come back in order; committed segments disappear from disk."""
    log = SpillLog(tmp_path)
    samples = [synthetic_sample(i, 50) for i in range(10)]
    log.append(samples[:4])
    log.append(samples[4:])
    assert log.pending == 10
    got: list[str] = []
    while (batch := log.read_batch(3)) is not None:
        got.extend(s.sample_id for s in batch.samples)
        log.commit(batch)
    assert got == [s.sample_id for s in samples]
    assert log.pending == 0
    assert not list(log.folder.glob("*.spill"))
    log.close()
    assert not log.folder.exists()


def test_spill_log_left_by_a_dead_process_is_adopted(tmp_path: Path) -> None:
    """Segments of a closed (or crashed) spill log are replayed by the next log on that root,
    resuming after the last committed batch."""
    first = SpillLog(tmp_path)
    first.append([synthetic_sample(i, 20) for i in range(6)])
    batch = first.read_batch(2)
    assert batch is not None
    first.commit(batch)
    first.close()  # undelivered samples stay on disk
    second = SpillLog(tmp_path)
    assert second.pending == 4
    rest = second.read_batch(10)
    assert rest is not None
    assert [s.sample_id for s in rest.samples] == [f"ep{i // 4}/{i}" for i in range(2, 6)]
    second.commit(rest)
    assert second.read_batch(10) is None
    second.close()
    assert not tmp_path.exists()  # replayed and empty: the root is removed too


def test_a_live_spill_log_is_not_adopted(tmp_path: Path) -> None:
    """Two live processes' spill logs on one root never replay each other's samples."""
    first = SpillLog(tmp_path)
    first.append([synthetic_sample(1, 10)])
    second = SpillLog(tmp_path)
    assert second.pending == 0
    first.close()
    second.close()


def test_torn_last_frame_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A crash mid-append tears at most the last frame; the frames before it are replayed."""
    log = SpillLog(tmp_path)
    log.append([synthetic_sample(i, 30) for i in range(3)])
    (segment,) = log.folder.glob("*.spill")
    log.close()
    data = segment.read_bytes()
    segment.write_bytes(data[:-5])
    with caplog.at_level(logging.WARNING):
        ids = [s.sample_id for s in iter_spill_file(segment)]
    assert ids == ["ep0/0", "ep0/1"]
    assert "torn" in caplog.text

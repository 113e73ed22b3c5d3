"""The default JSON Lines sink under real faults: a file-size limit (a full disk without root),
SIGKILL of the writing process at random points, a torn tail left by a crash, retried batches.

Each fault runs in a child process, which prints the sample ids of every batch whose `write`
returned (acknowledged); the parent then checks the file with `read_samples` and the CLI.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from tito_agents.cli.main import main as cli_main
from tito_agents.errors import SinkError
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.jsonl import JsonlSink, encode_sample
from tito_agents.sinks.reading import read_samples

# A child that writes batches of samples and prints the ids of each acknowledged batch.
# argv: path, first index, batches, tokens per sample, file-size limit (0: none), mode.
_WRITER = textwrap.dedent(
    """
    import json, resource, sys, time
    from tito_agents.errors import SinkError
    from tito_agents.sinks.buffered import BufferedSink, Backoff
    from tito_agents.sinks.jsonl import JsonlSink
    from tito_agents.sinks.harness import synthetic_sample

    path, first, batches, tokens, limit, mode = sys.argv[1:7]
    first, batches, tokens, limit = int(first), int(batches), int(tokens), int(limit)
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    sink = JsonlSink(path)
    index = first
    refused = 0
    if mode == "buffered":
        buffered = BufferedSink(
            sink, retry=Backoff(initial=0.001, maximum=0.005), linger=0, batch_size=3
        )
        for b in range(batches):
            batch = [synthetic_sample(index + i, tokens) for i in range(1 + b % 4)]
            index += len(batch)
            buffered.write(batch)
        deadline = time.monotonic() + 60  # until the limit refused a write (or all is written)
        while not buffered.stats.failed_attempts and buffered.pending and time.monotonic() < deadline:
            time.sleep(0.005)
        delivered = buffered.force_flush(timeout=0.1)
        print(json.dumps({"refused": buffered.stats.failed_attempts, "delivered": delivered}))
        sys.stdout.flush()
        import os
        os._exit(0)  # the rest stays queued: it was never acknowledged as written
    for b in range(batches):
        batch = [synthetic_sample(index + i, tokens) for i in range(1 + b % 4)]
        index += len(batch)
        try:
            sink.write(batch)
        except SinkError as exc:
            assert exc.retryable, exc
            refused += 1
            continue
        print(json.dumps([s.sample_id for s in batch]))
        sys.stdout.flush()
    print(json.dumps({"refused": refused}))
    """
)


def _run_writer(
    path: Path, first: int, batches: int, tokens: int, limit: int = 0, mode: str = "plain"
) -> tuple[list[str], dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path), str(first), str(batches), str(tokens)]
        + [str(limit), mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    acked: list[str] = []
    summary: dict[str, object] = {}
    for line in done.stdout.splitlines():
        value = json.loads(line)
        if isinstance(value, list):
            acked.extend(value)
        else:
            summary = value
    return acked, summary


def _ids(path: Path) -> list[str]:
    return [s.sample_id for s in read_samples(path)]


def _line_ids(path: Path) -> list[str]:
    """The sample ids of the file's complete lines, read without building samples (the file grows
    by every trial; `read_samples` and the CLI read it whole too, once per trial and at the end)."""
    lines = path.read_bytes().split(b"\n")[:-1]  # the last piece is a torn tail or empty
    return [orjson.loads(line)["sample_id"] for line in lines if line.strip()]


def _cli(*argv: str) -> int:
    return cli_main(list(argv))


def test_a_refused_write_leaves_whole_lines_only(tmp_path: Path) -> None:
    """A file-size limit (EFBIG, as a full disk) refuses writes part-way: each refused batch is cut
    back, acknowledged batches are all there once, and the file reads whole; a later writer
    appends cleanly after it."""
    path = tmp_path / "samples.jsonl"
    acked, summary = _run_writer(path, 0, 60, 200, limit=40_000)
    assert summary["refused"], "the limit must have refused some writes"
    assert _ids(path) == acked  # nothing torn, nothing glued, nothing unacknowledged
    assert path.read_bytes().endswith(b"\n")
    more, _ = _run_writer(path, 10_000, 5, 50)
    assert _ids(path) == acked + more
    assert _cli("stats", str(path)) == 0


def test_a_retried_batch_never_duplicates_lines(tmp_path: Path) -> None:
    """Under `BufferedSink` a refused batch is retried: lines of the refused attempts never stay
    behind, so each sample is in the file at most once."""
    path = tmp_path / "samples.jsonl"
    _, summary = _run_writer(path, 0, 80, 200, limit=50_000, mode="buffered")
    assert summary["refused"], "the limit must have refused some writes"
    ids = _ids(path)
    assert ids and len(ids) == len(set(ids))
    assert _cli("stats", str(path)) == 0


@pytest.mark.timeout(900)  # 12 writers of 4000-token samples: ≈ 110 s on 2 loaded cores
def test_sigkill_at_random_points_loses_no_acknowledged_sample(tmp_path: Path) -> None:
    """SIGKILL of a writer at random points (12 trials on one file, each restarted writer
    appending after the last): every acknowledged sample is in the file, the file is readable by
    `read_samples` and the CLI, and a restarted writer repairs a torn tail before appending."""
    rng = random.Random(14)
    path = tmp_path / "samples.jsonl"
    acked: list[str] = []
    for trial in range(12):
        child = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(trial * 100_000), "100000", "4000"]
            + ["0", "plain"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        first = child.stdout.readline()  # the writer is writing now
        time.sleep(rng.uniform(0.0, 0.1))  # the writer is mid-batch at any of these points
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
        for line in [first, *rest.splitlines()]:
            if line.strip():
                acked.extend(json.loads(line))
        on_disk = _line_ids(path)
        assert set(acked) <= set(on_disk), f"trial {trial}: acknowledged samples lost"
        assert len(on_disk) == len(set(on_disk))
        assert _cli("stats", "--allow-truncated", str(path)) == 0
    sink = JsonlSink(path)
    sink.write([synthetic_sample(999_999_999, 16)])
    sink.close()
    assert _cli("stats", str(path)) == 0  # the last torn tail (if any) was cut by the reopen
    assert set(acked) <= set(_ids(path))
    assert _ids(path) == _line_ids(path)


def test_a_reopened_torn_file_is_repaired_before_appending(tmp_path: Path) -> None:
    """A torn last line (a crash mid-write) is cut off when a sink reopens the file: the next
    write does not glue onto it, and nothing but the torn bytes is lost."""
    path = tmp_path / "samples.jsonl"
    good = [synthetic_sample(i, 32) for i in range(3)]
    torn = encode_sample(synthetic_sample(3, 32))[:57]
    path.write_bytes(b"".join(encode_sample(s) for s in good) + torn)
    sink = JsonlSink(path)
    sink.write([synthetic_sample(4, 32)])
    sink.close()
    assert sink.torn_bytes_cut == len(torn)
    assert _ids(path) == [s.sample_id for s in good] + [synthetic_sample(4, 32).sample_id]
    assert _cli("stats", str(path)) == 0


def test_a_complete_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    """A last line that is a whole sample but lacks its newline gets the newline, not the knife."""
    path = tmp_path / "samples.jsonl"
    path.write_bytes(encode_sample(synthetic_sample(0, 16)).rstrip(b"\n"))
    with JsonlSink(path) as sink:
        sink.write([synthetic_sample(1, 16)])
    assert sink.torn_bytes_cut == 0
    assert _ids(path) == [synthetic_sample(0, 16).sample_id, synthetic_sample(1, 16).sample_id]


def test_write_returns_with_the_bytes_in_the_os(tmp_path: Path) -> None:
    """Nothing waits in a user-space buffer: another reader sees a batch as soon as `write`
    returns, without `flush`."""
    path = tmp_path / "samples.jsonl"
    sink = JsonlSink(path)
    sink.write([synthetic_sample(0, 16)])
    assert _ids(path) == [synthetic_sample(0, 16).sample_id]
    sink.close()


def test_permission_refusal_is_not_retryable(tmp_path: Path) -> None:
    """A file that cannot be opened at all is a non-retryable error (retrying would not help)."""
    if os.geteuid() == 0:
        folder = tmp_path / "a-file"
        folder.write_text("x")
        target = folder / "samples.jsonl"  # a path under a regular file: ENOTDIR
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
        target = folder / "samples.jsonl"
    with pytest.raises(SinkError) as info:
        JsonlSink(target).write([synthetic_sample(0, 8)])
    assert not info.value.retryable


def test_buffered_default_delivers_and_flushes(tmp_path: Path) -> None:
    """The buffered JSON Lines sink `Collector(path)` uses delivers in order on flush."""
    path = tmp_path / "samples.jsonl"
    sink = BufferedSink(JsonlSink(path), spill_dir=tmp_path / "spill")
    samples = [synthetic_sample(i, 8) for i in range(10)]
    sink.write(samples[:4])
    sink.write(samples[4:])
    sink.flush()
    assert _ids(path) == [s.sample_id for s in samples]
    sink.close()

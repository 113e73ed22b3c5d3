"""One state root: `$TITO_CACHE_DIR` (default `~/.cache/tito-agents`) holds the spill folders, the
gateway's journal and control token, and the converted-artefact cache; spill folders exist only
while something is spilled."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

import tito_agents as tito
from tests.support.capture_replay import Replay, load_capture, replay_clients, run_sync
from tito_agents import _state_dirs
from tito_agents.cli.serve import TOKEN_ENV, control_token
from tito_agents.samples import Sample
from tito_agents.sinks import BufferedSink, MemorySink, Sink
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.registry import default_spill_dir
from tito_agents.testing import smollm2


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TITO_CACHE_DIR", str(root))
    monkeypatch.delenv("TITO_SPILL_DIR", raising=False)
    return root


def test_the_state_root_is_tito_cache_dir_or_the_home_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`$TITO_CACHE_DIR` when set (with ~ expanded), else ~/.cache/tito-agents; the testing
    cache (SmolLM2) uses the same root."""
    monkeypatch.delenv("TITO_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _state_dirs.state_root() == tmp_path / "home" / ".cache" / "tito-agents"
    monkeypatch.setenv("TITO_CACHE_DIR", "~/state")
    assert _state_dirs.state_root() == tmp_path / "home" / "state"
    assert smollm2.cache_root() == _state_dirs.state_root()


def test_spill_folders_live_under_the_state_root_unless_tito_spill_dir_says_otherwise(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default spill folder: <state root>/spill/<destination>; `$TITO_SPILL_DIR` moves only the
    spill folders. Neither is created by naming it."""
    assert default_spill_dir("memory") == cache / "spill" / "memory"
    sink = tito.sinks.open_sink("memory://", buffered=True)
    assert isinstance(sink, BufferedSink) and sink.spill_dir == cache / "spill" / "memory"
    sink.close()
    monkeypatch.setenv("TITO_SPILL_DIR", str(tmp_path / "elsewhere"))
    assert default_spill_dir("memory") == tmp_path / "elsewhere" / "memory"
    assert not cache.exists() and not (tmp_path / "elsewhere").exists()


def test_a_collector_that_never_spills_leaves_no_folder(cache: Path, tmp_path: Path) -> None:
    """`Collector(path)` (buffered, with a default spill folder) writes its samples and, having
    spilled nothing, leaves nothing under the state root."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(tmp_path / "samples.jsonl")
    assert isinstance(collector.sink, BufferedSink) and collector.sink.spill_dir is not None
    assert collector.sink.spill_dir.is_relative_to(cache / "spill")
    collector.wrap(client)
    with collector.episode("e1"):
        run_sync(client, cap)
    collector.close()
    assert len(list(tito.read_samples(tmp_path / "samples.jsonl"))) == 1
    assert not cache.exists()


class _HeldSink(Sink):
    """Holds its first write until `release` is set (`entered`: that write has begun); with
    `refuse_rest`, refuses every later write (the destination went away)."""

    def __init__(self, refuse_rest: bool = False) -> None:
        self.inner = MemorySink()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.refuse_rest = refuse_rest

    def write(self, samples: Sequence[Sample]) -> None:
        if self.entered.is_set() and self.refuse_rest:
            raise tito.SinkError("down", retryable=True)
        self.entered.set()
        self.release.wait()
        self.inner.write(samples)


def test_a_spill_folder_is_made_on_the_first_spill_and_removed_once_empty(cache: Path) -> None:
    """A sample that does not fit the memory bound is spilled: only then does the folder exist;
    once the spilled sample is delivered, `close` removes the emptied folder."""
    held = _HeldSink()
    folder = default_spill_dir("held")
    sink = BufferedSink(held, max_buffer_samples=1, spill_dir=folder, pace_after=None)
    samples = [synthetic_sample(i, 8) for i in range(3)]
    sink.write(samples[:1])
    assert held.entered.wait(30)  # the worker holds sample 0
    assert not folder.exists()
    sink.write(samples[1:2])  # waits in memory (the bound)
    assert not folder.exists()
    sink.write(samples[2:])  # beyond the bound: spilled
    assert sink.stats.spilled == 1 and folder.is_dir()
    held.release.set()
    sink.flush()
    sink.close()
    assert [s.sample_id for s in held.inner.samples] == [s.sample_id for s in samples]
    assert not folder.exists()


def test_spilled_samples_keep_their_folder_until_delivered(cache: Path) -> None:
    """A folder that still holds undelivered samples at close stays (the next sink on it
    delivers them), and is removed once that sink has delivered them."""
    held = _HeldSink(refuse_rest=True)
    folder = default_spill_dir("held")
    sink = BufferedSink(held, max_buffer_samples=1, spill_dir=folder, pace_after=None)
    samples = [synthetic_sample(i, 8) for i in range(3)]
    sink.write(samples[:1])
    assert held.entered.wait(30)
    sink.write(samples[1:2])  # waits in memory
    sink.write(samples[2:])  # spilled
    held.release.set()  # sample 0 is delivered, then the destination refuses the rest
    sink.close(timeout=0)
    assert folder.is_dir()
    after = MemorySink()
    with BufferedSink(after, spill_dir=folder) as again:
        again.flush()
    assert {s.sample_id for s in held.inner.samples + after.samples} == {
        s.sample_id for s in samples
    }
    assert not folder.exists()


def test_gateway_journal_and_token_live_under_the_state_root(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's default journal and control-token file are under the state root; the token
    file is made there (mode 0600) when missing, and read back next time."""
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert _state_dirs.gateway_journal_path(8100) == cache / "gateway-8100.journal"
    token = control_token(None, 8100)
    path = cache / "gateway-8100.token"
    assert path.read_text().strip() == token and path.stat().st_mode & 0o777 == 0o600
    assert control_token(None, 8100) == token

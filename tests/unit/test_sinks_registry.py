"""open_sink: one argument picks the sink; options are typed; optional libraries fail helpfully."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tito_agents.errors import ConfigurationError
from tito_agents.sinks.base import MemorySink
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.files import RotatingFileSink
from tito_agents.sinks.harness import synthetic_sample
from tito_agents.sinks.jsonl import JsonlSink
from tito_agents.sinks.queue import AsyncQueueSink
from tito_agents.sinks.reading import read_samples
from tito_agents.sinks.registry import default_spill_dir, open_sink


def test_paths_pick_file_sinks(tmp_path: Path) -> None:
    """A .jsonl path is the plain JSON Lines sink; .parquet/.arrow (or rotation options) rotate."""
    plain = open_sink(tmp_path / "a.jsonl")
    assert type(plain) is JsonlSink
    rotating = open_sink(f"{tmp_path}/b.jsonl?max_file_samples=2")
    parquet = open_sink(str(tmp_path / "c.parquet"), max_file_samples=10, compression="zstd")
    arrow = open_sink(f"file://{tmp_path}/d.arrow")
    folder = open_sink(f"{tmp_path}/e/", format="arrow")
    assert isinstance(rotating, RotatingFileSink) and isinstance(parquet, RotatingFileSink)
    assert isinstance(arrow, RotatingFileSink) and isinstance(folder, RotatingFileSink)
    assert (parquet.format, parquet.max_file_samples) == ("parquet", 10)
    assert (arrow.format, folder.format, folder.stem) == ("arrow", "arrow", "samples")
    samples = [synthetic_sample(i, 8) for i in range(5)]
    for sink in (plain, rotating, parquet, arrow, folder):
        sink.write(samples)
        sink.close()
    assert len(list(read_samples(tmp_path / "a.jsonl"))) == 5
    assert len(list(read_samples(tmp_path / "b.jsonl"))) == 5
    assert len(list(read_samples(tmp_path / "e"))) == 5


def test_in_process_specs() -> None:
    """memory:// and asyncio:// give the in-process sinks, with typed query options."""
    assert type(open_sink("memory://")) is MemorySink
    queue = open_sink("asyncio://?maxsize=7")
    assert isinstance(queue, AsyncQueueSink) and queue.maxsize == 7
    queue.close()


def test_buffered_wrapping_and_default_spill_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """buffered=True wraps any sink; the default spill folder is under $TITO_SPILL_DIR, named
    after the destination without credentials."""
    monkeypatch.setenv("TITO_SPILL_DIR", str(tmp_path / "spill"))
    sink = open_sink("memory://", buffered=True, max_buffer_samples=5, linger=0)
    assert isinstance(sink, BufferedSink) and sink.max_buffer_samples == 5
    assert sink.spill_dir == tmp_path / "spill" / "memory"
    sink.write([synthetic_sample(0, 4)])
    sink.close()
    assert isinstance(sink.inner, MemorySink) and len(sink.inner.samples) == 1
    key = "redis-10.0.0.5-6379/0-rollouts"
    assert default_spill_dir(key) == tmp_path / "spill" / "redis-10.0.0.5-6379_0-rollouts"
    unbuffered = open_sink("memory://", buffered=True, spill_dir=None)
    assert isinstance(unbuffered, BufferedSink) and unbuffered.spill_dir is None
    unbuffered.close()


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("out.txt", {}, "file format"),
        ("kafka://broker/topic", {}, "unknown sink"),
        ("x.parquet?max_file_samples=lots", {}, "max_file_samples"),
        ("x.parquet?colour=blue", {}, "unknown option 'colour'"),
        ("x.parquet", {"stream": "s"}, "unknown option"),
        ("memory://", {"linger": 0.1}, "buffered=True"),
    ],
)
def test_bad_specs_are_configuration_errors(
    tmp_path: Path, spec: str, options: dict[str, Any], message: str
) -> None:
    """A spec or option that cannot work raises ConfigurationError naming the problem."""
    with pytest.raises(ConfigurationError, match=message):
        open_sink(spec if "://" in spec else str(tmp_path / spec), **options)


@pytest.mark.parametrize(
    ("library", "spec"),
    [
        ("pyarrow", "out/x.parquet"),
        ("redis", "redis://127.0.0.1:1/0"),
        ("ray", "ray://q"),
    ],
)
def test_missing_optional_library_says_how_to_install_it(library: str, spec: str) -> None:
    """Without an optional library the sink raises ConfigurationError with the pip command,
    and the core (JSON Lines) keeps working."""
    code = (
        "import sys\n"
        f"sys.modules[{library!r}] = None\n"
        "from tito_agents.errors import ConfigurationError\n"
        "from tito_agents.sinks.registry import open_sink\n"
        "import tito_agents, tempfile, os\n"
        "open_sink(os.path.join(tempfile.mkdtemp(), 'ok.jsonl')).close()\n"
        "try:\n"
        f"    open_sink({spec!r}, buffered=False)\n"
        "except ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"needs {library!r}" in done.stdout and "pip install" in done.stdout

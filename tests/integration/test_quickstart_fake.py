"""The quickstart example runs against the fake server and writes readable, exact samples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeVLLMServer

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_writes_samples(fake_server: FakeVLLMServer, tmp_path: Path) -> None:
    """`examples/quickstart.py` completes, prints its summary and leaves one sample per call."""
    out = tmp_path / "samples.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "quickstart.py"),
            "--base-url",
            fake_server.base_url,
            "--episodes",
            "4",
            "--concurrency",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "== tito-agents quickstart ==" in result.stdout
    samples = list(tito.read_samples(out))
    assert len(samples) == 8  # two calls per episode: the tool call and the answer
    assert {s.task_id for s in samples} <= {
        f"weather-{c}" for c in ("Paris", "Tokyo", "Oslo", "Lima")
    }
    for sample in samples:
        assert sample.logprobs is not None
        span = sample.spans[0]
        assert (
            sample.loss_mask[span.start : span.end].all()
            and not sample.loss_mask[: span.start].any()
        )
    assert "would have come back with other token ids" in result.stdout

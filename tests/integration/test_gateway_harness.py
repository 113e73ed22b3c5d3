"""A real CLI harness from PyPI through the gateway: Simon Willison's `llm` (pinned below),
which takes an OpenAI-compatible base URL, run as a subprocess against the fake vLLM — streamed
and not, and a continued conversation — produces exact samples of what it printed.

`llm` is installed in its own virtual environment (it brings its own dependencies), made on
first use under ~/.cache/tito-agents (`TITO_HARNESS_VENV` overrides the folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tito_agents as tito
from tests.support.gateway_harness import ServedGateway
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer
from tito_agents.testing.smollm2 import EOS_ID, load_tokenizer

LLM_VERSION = "0.36"
VENV = Path(
    os.environ.get("TITO_HARNESS_VENV")
    or Path.home() / ".cache" / "tito-agents" / f"harness-llm-{LLM_VERSION}"
)


def llm_command() -> Path:
    """The `llm` executable of the harness environment (made and installed on first use)."""
    exe = VENV / "bin" / "llm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
        done = subprocess.run(
            [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", f"llm=={LLM_VERSION}"],
            capture_output=True,
            timeout=900,
        )
        if done.returncode != 0:
            pytest.fail(f"could not install llm=={LLM_VERSION}: {done.stderr.decode()[-2000:]}")
    return exe


def last_user_responder(view: object) -> str:
    """Answers the last user message (a continued conversation gets a new answer)."""
    users = [m for m in getattr(view, "messages", ()) if m.get("role") == "user"]
    return f"You said: {users[-1].get('content')}" if users else "ok"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=last_user_responder)) as server:
        yield server


def test_llm_cli_through_the_gateway_gives_exact_samples(
    fake: FakeVLLMServer, tmp_path: Path
) -> None:
    exe = llm_command()
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, fake.base_url) as served:
        control = served.control()
        control.open("llm-ep")
        (tmp_path / "extra-openai-models.yaml").write_text(
            f"- model_id: gateway\n  model_name: {MODEL_NAME}\n"
            f"  api_base: {served.url}/episodes/llm-ep/v1\n"
        )
        env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "agent-key"}
        printed = []
        for args in (["first question"], ["--no-stream", "-c", "second question"]):
            out = subprocess.run(
                [str(exe), "-m", "gateway", *args],
                env=env,
                capture_output=True,
                check=True,
                timeout=120,
            )
            printed.append(out.stdout.decode().strip())
        report = control.close("llm-ep", reward=1.0)
    collector.close()
    assert printed[0] == "You said: first question"
    assert printed[1] == "You said: second question"
    assert (report["calls"], report["complete"], report["samples"]) == (2, 2, 2)
    assert isinstance(collector.sink, MemorySink)
    tokenizer = load_tokenizer()
    samples = sorted(captured_samples(collector), key=lambda s: s.spans[0].start)
    texts = []
    for sample in sorted(captured_samples(collector), key=lambda s: len(s.token_ids)):
        span = sample.spans[0]
        sampled = sample.token_ids[span.start : span.end].tolist()
        assert sampled[-1] == EOS_ID
        texts.append(tokenizer.decode(sampled[:-1]))
        assert sample.loss_mask[span.start : span.end].all()
    assert texts == printed  # the second, continued, prompt is the longer one
    first, second = sorted(samples, key=lambda s: len(s.token_ids))
    assert second.token_ids.tolist()[: len(first.token_ids)] == first.token_ids.tolist()

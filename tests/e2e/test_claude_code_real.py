"""Claude Code, unmodified, against the gateway in front of the real CPU vLLM: every call it makes
becomes an exact sample. Opt-in: set `TITO_CLAUDE_CODE` to the `claude` binary of
`npm install @anthropic-ai/claude-code` (2.1.x; the native binary is
`node_modules/@anthropic-ai/claude-code-linux-x64/claude`), else the test is skipped.

Claude Code's default request does not fit SmolLM2: its 24 built-in tools (about 64 KB of JSON
schemas) and system prompt render to about 20,000 tokens (SmolLM2's context is 8,192; the e2e
server's `--max-model-len` 4,096), and it asks for `max_tokens: 32000`. The run here is Claude
Code's own smaller configuration, no code changed: `--bare`, two built-in tools (`--tools
Write,Read`), a one-line `--system-prompt`, `CLAUDE_CODE_MAX_OUTPUT_TOKENS=200` (about 530 prompt
tokens). Its requests stream, carry `?beta=true`, `thinking: {"type": "adaptive"}`,
`output_config.effort` and `context_management` (ignored by vLLM, as by the conversion).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tito_agents as tito
from tests.support.gateway_harness import ServedGateway
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

CLAUDE = os.environ.get("TITO_CLAUDE_CODE", "")


@pytest.mark.skipif(not CLAUDE, reason="set TITO_CLAUDE_CODE to a Claude Code 2.1.x binary")
def test_claude_code_through_the_gateway_gives_one_exact_sample_per_call(
    vllm_base_url: str, vllm_model: str, tmp_path: Path
) -> None:
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, vllm_base_url, read_timeout=300.0) as gateway:
        control = gateway.control()
        opened = control.open("claude-code")
        env = {
            **os.environ,
            "HOME": str(tmp_path),
            "ANTHROPIC_BASE_URL": gateway.url + opened["base_url"].removesuffix("/v1"),
            "ANTHROPIC_API_KEY": "EMPTY",
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "200",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        command = [
            CLAUDE,
            "--bare",
            "-p",
            "Create a file hello.txt containing the word hi.",
            "--model",
            vllm_model,
            "--tools",
            "Write,Read",
            "--system-prompt",
            "You are a coding agent. Use the tools.",
            "--max-turns",
            "3",
            "--output-format",
            "json",
        ]
        run = subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
        )
        report = control.close("claude-code")
    # the harness ran to its result; a 135M model may ramble past the output limit each time
    # (Claude Code then ends with is_error and exit status 1): the calls are exact either way
    result = json.loads(run.stdout)
    assert result["type"] == "result", run.stderr[-2000:]
    assert report["calls"] >= 1 and report["complete"] == report["calls"] == report["samples"]
    samples = captured_samples(collector)
    assert len(samples) == report["calls"]
    if "usage" in result:  # what Claude Code counted is what was sampled
        assert sum(int(s.loss_mask.sum()) for s in samples) == result["usage"]["output_tokens"]
    assert collector.stats.uncaptured_requests == 0
    collector.close()

"""Chat templates of real model families on the real CPU vLLM.

The server serves the SmolLM2 weights and renders each conversation with a real template of
another family (vendored in tests/data/templates/real, sources in its README), given per request
as `chat_template` (vLLM applies it exactly as `--chat-template`; the server runs with
`--trust-request-chat-template`, so one server covers the whole matrix instead of a restart per
template). SmolLM2's tokenizer knows ChatML's `<|im_start|>`/`<|im_end|>` as special tokens; other
families' special tokens (`<|eot_id|>`, `<｜end▁of▁sentence｜>`) are plain text to it.

For each template: an append-only tool episode without sessions and one with sessions, every
sample re-scored (`/v1/completions` prompt logprobs) against its rollout logprobs; where the
audit (`tito-agents audit-template` at token level with SmolLM2's tokenizer) passes the appends
the episode makes, sessions give exactly one sample per episode, token-in from the first episode
on; where it fails, every append falls back with the reason that matches the audit's finding,
and templates that re-render history give one sample with `session_history="sampled"`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

import tito_agents as tito
from tests.support.e2e_servers import ServerConfig, VllmServers
from tests.support.real_vllm import MAX_TOL, MEAN_TOL, TOOLS
from tests.support.rescore_check import constrained, rescore_sample
from tito_agents.calls import SessionNote
from tito_agents.cli._templates import load_renderer
from tito_agents.cli.audit.cases import AuditCase
from tito_agents.cli.audit.command import audit_template
from tito_agents.sessions import FallbackReason
from tito_agents.testing import captured_samples
from tito_agents.testing.smollm2 import tokenizer_dir

pytestmark = pytest.mark.e2e

TEMPLATES = Path(__file__).resolve().parents[1] / "data" / "templates" / "real"

# the audit's hint codes for the appends of `episode` (pinned, so a changed audit or template
# is seen here); sessions must then do what the finding says
EXPECTED: dict[str, set[str]] = {
    "qwen3": {"reasoning_block_dropped"},  # drops the empty reasoning block of earlier turns
    "qwen3_training": set(),
    "llama3_1": {"token_boundary"},  # <|eot_id|> is text to SmolLM2's tokenizer
    # so is <｜end▁of▁sentence｜>; and it drops a tool call that comes without text
    "deepseek_r1_distill": {"token_boundary", "content_dropped"},
    "nemotron_3_nano": set(),
}
# the session's fallback reason for each kind of audit finding
REASONS = {
    "token_boundary": FallbackReason.END_OF_TURN_NOT_ONE_TOKEN,
    "re-renders": "renders the previous assistant turn differently",
}
APPENDS = (  # the appends an episode makes: a tool result after a tool call, a user turn
    AuditCase("append", tool_calls=True, reasoning=False, tools=True, appended="tool"),
    AuditCase("append", tool_calls=False, reasoning=False, tools=True, appended="user"),
)


@cache
def audit_codes(name: str) -> frozenset[str]:
    """The hint codes of the audit of `name` (token level, SmolLM2's tokenizer) on the episode's
    appends; empty when every case passes."""
    renderer = load_renderer(TEMPLATES / f"{name}.jinja", tokenizer=tokenizer_dir())
    report = audit_template(renderer, APPENDS)
    failed = [r for r in report.results if r.verdict != "pass"]
    assert all(r.hint is not None for r in failed), report.to_dict()
    return frozenset(r.hint.code for r in failed if r.hint is not None)


def finding(codes: frozenset[str]) -> str:
    """What sessions must do: "pass" (token-in), "token_boundary" (no end-of-turn token: the
    session cannot cut a turn, whatever else the template does) or "re-renders" (history)."""
    if not codes:
        return "pass"
    if "token_boundary" in codes:
        return "token_boundary"
    assert all(code.startswith("reasoning") for code in codes), codes
    return "re-renders"


def _accepts_request_templates(base_url: str) -> bool:
    body = {"messages": [{"role": "user", "content": "."}], "chat_template": "{{ 'x' }}"}
    response = httpx.post(f"{base_url.removesuffix('/v1')}/tokenize", json=body, timeout=30)
    return response.status_code == 200


@pytest.fixture(scope="session")
def template_server(vllm_base_url: str, vllm_servers: VllmServers) -> str:
    """The standard server (scripts/vllm_server.py starts it with `--trust-request-chat-template`),
    else, where it runs without (an older instance left running), one of that configuration of
    our own on a free port, stopped at the end of the session."""
    if _accepts_request_templates(vllm_base_url):
        return vllm_base_url
    url = vllm_servers.url(ServerConfig(extra_args="--trust-request-chat-template"))
    if not _accepts_request_templates(url):
        pytest.fail(f"the vLLM on {url} refuses request chat templates; restart it", pytrace=False)
    return url


@pytest.fixture(scope="session")
def template_model(template_server: str) -> str:
    response = httpx.get(f"{template_server}/models", timeout=10)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def episode(client: openai.OpenAI, model: str, template: str, seed: int) -> None:
    """Forced tool call, tool result, answer, user follow-up, answer: history only appended."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris? Use the tool."},
    ]
    for turn in range(3):
        response = client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=24,
            temperature=1.0,
            seed=seed + turn,
            tool_choice="required" if turn == 0 else "none",
            extra_body={"chat_template": template},
        )
        message = response.choices[0].message
        messages.append(
            message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        )
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Thanks! Say it again in five words."})


def run(
    base_url: str, model: str, template: str, *, sessions: bool, history: str = "template"
) -> tuple[tito.Episode, list[tito.Sample]]:
    collector = tito.Collector(capture_logprobs=True, assembly="merged", session_history=history)
    client = collector.wrap(openai.OpenAI(base_url=base_url, api_key="EMPTY"), sessions=sessions)
    with client, collector.episode("ep") as ep:
        episode(client, model, template, seed=7)
    return ep, captured_samples(collector)


def check_exact(base_url: str, model: str, ep: tito.Episode, samples: list[tito.Sample]) -> None:
    """Every sampled id trained once, and the server's re-scoring reproduces the logprobs."""
    assert sum(int(s.loss_mask.sum()) for s in samples) == sum(c.num_sampled for c in ep.calls)
    skip = {c.call_id for c in ep.calls if constrained(c)}
    for sample in samples:
        result = rescore_sample(base_url, model, sample, skip)
        if result.tokens:
            assert result.mean_abs < MEAN_TOL and result.max_abs < MAX_TOL, result


def one_chain(ep: tito.Episode, samples: list[tito.Sample], notes: set[str]) -> None:
    """One sample: the engine's prompt deltas and sampled ids, turn by turn."""
    calls = sorted(ep.calls, key=lambda c: c.seq)
    assert all(c.session in notes for c in calls[1:]), [
        (c.session, c.session_reason) for c in calls
    ]
    assert len(samples) == 1 and ep.divergences == []
    pieces, pos = [], 0
    for call in calls:
        pieces += [call.prompt_ids[pos:], call.sampled_ids]
        pos = call.prompt_ids.shape[0] + call.sampled_ids.shape[0]
    assert np.array_equal(np.concatenate(pieces), samples[0].token_ids)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_template_matrix(name: str, template_server: str, template_model: str) -> None:
    """The audit's verdict and the server's behaviour agree; every sample is exact."""
    codes = audit_codes(name)
    assert codes == EXPECTED[name]
    expect = finding(codes)
    template = (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")
    server, model = template_server, template_model

    # The runs are independent episodes: side by side, the server batches their calls (one at a
    # time would leave most of its CPU idle between the test's own steps).
    with ThreadPoolExecutor(3) as pool:
        plain = pool.submit(run, server, model, template, sessions=False)
        token_in = pool.submit(run, server, model, template, sessions=True)
        sampled = (  # the opt-in that keeps the sampled tokens
            pool.submit(run, server, model, template, sessions=True, history="sampled")
            if expect == "re-renders"
            else None
        )

    ep, samples = plain.result()
    check_exact(template_server, template_model, ep, samples)

    ep, samples = token_in.result()
    if expect == "pass":
        one_chain(ep, samples, {SessionNote.TOKEN_IN, SessionNote.TOKEN_IN_BRIDGED})
    else:
        for call in ep.calls[1:]:
            assert call.session == SessionNote.FALLBACK
            assert REASONS[expect] in (call.session_reason or ""), call.session_reason
    check_exact(template_server, template_model, ep, samples)

    if sampled is not None:  # the opt-in keeps the sampled tokens: one sample again
        ep, samples = sampled.result()
        one_chain(ep, samples, {SessionNote.TOKEN_IN_SAMPLED})
        check_exact(template_server, template_model, ep, samples)

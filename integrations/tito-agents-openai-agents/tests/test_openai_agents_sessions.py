"""Token-in sessions under the Agents SDK, on both of its APIs (the default Responses model and
Chat Completions): the SDK's input list only ever appends, so each agent's later calls are planned
token-in, each prompt extending the agent's previous prompt + sampled ids."""

from __future__ import annotations

import itertools

import numpy as np
import tito_agents_openai_agents as tito_oa
from agents import Runner
from oa_script import build_agents

import tito_agents as tito
from tito_agents.testing.smollm2 import MODEL_NAME


async def test_a_handoff_run_is_token_in_per_agent(capture: tito_oa.AgentsCapture) -> None:
    agents = build_agents(MODEL_NAME)
    async with capture.collector.episode(sessions=True) as ep:
        result = await Runner.run(agents.triage, "case-7: about my invoice")
    assert result.final_output == "[billing] case-7: your invoice is paid."
    calls = sorted(ep.calls, key=lambda c: c.seq)
    notes = [(c.agent, c.session, c.session_reason) for c in calls]
    # each agent is its own session: its first call renders, its later ones are token-in
    assert [(c.agent, c.session) for c in calls] == [
        ("triage", "first"),
        ("billing", "first"),
        ("billing", "token_in"),
    ], notes
    for prev, nxt in itertools.pairwise(calls[1:]):
        head = np.concatenate((prev.prompt_ids, prev.sampled_ids))
        assert np.array_equal(nxt.prompt_ids[: head.shape[0]], head)
    assert all(c.status is tito.CallStatus.COMPLETE for c in calls)

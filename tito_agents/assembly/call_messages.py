"""Opt-in: write each call's chat request (messages, tools) into the samples that hold it.

`tito-agents drift --chat-template` re-renders a call's messages with the server's template and
compares the result with the prompt ids the engine really saw; it reads them from
`metadata["call_messages"][call_id] = {"messages": [...], "tools": [...]}`. Assembly never writes
them on its own: they are kept on `Call` in memory only (`Collector(keep_messages=...)`), they can be
large (every call repeats the conversation so far) and they hold user data. A pipeline that wants the
drift check calls `attach_call_messages` on the samples of an episode before writing them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tito_agents.calls import Call
from tito_agents.samples import Sample

__all__ = ["CALL_MESSAGES_KEY", "attach_call_messages"]

CALL_MESSAGES_KEY = "call_messages"


def attach_call_messages(samples: Sequence[Sample], calls: Iterable[Call]) -> int:
    """Add `metadata["call_messages"]` to each sample for those of its calls whose messages were
    kept; returns how many samples got some. A call without messages (a completions call, or
    `keep_messages=False`) is left out, never guessed; a sample none of whose calls has messages is
    left unchanged."""
    requests: dict[str, dict[str, Any]] = {}
    for call in calls:
        if call.messages is not None:
            requests[call.call_id] = {"messages": call.messages, "tools": call.tools}
    attached = 0
    for sample in samples:
        own = {cid: requests[cid] for cid in sample.call_ids if cid in requests}
        if own:
            sample.metadata[CALL_MESSAGES_KEY] = own
            attached += 1
    return attached

"""Capture, in one room: everything between the agent's HTTP request and the `Call` record.

Where each part lives:

- `transport` — the httpx / httpx2 transports and the two runners (sync, async) of the flow;
- `flow` — the request flow as a generator of I/O steps (one implementation for sync and async);
  `steps` — those steps, and the helpers that read and build the HTTP library's messages;
- `core` — `CaptureCore`: decide, rewrite, snapshot the attribution, record a `Call`; `pending`
  (a request in flight), `tee` (the stream tee), `episode` (what capture calls on an episode),
  `session_store` (token-in sessions per (episode, agent)), `decoders` (content decoding);
- `wire/` — what every endpoint shares on the wire: `RequestInfo` and the dispatch of a request
  to its endpoint's preparation, the parser interface, splicing on raw JSON bytes (fields into a
  request, nulls into the caller's copy of an answer), the id fast path, SSE decoding;
- one folder per endpoint family, each with what capture adds to its requests (`request`) and
  how it reads its answers (`parser`): `chat/` (chat and completions), `responses/` (the
  Responses API), `messages/` (Anthropic Messages, served by vLLM through its chat conversion;
  its own flow steps, probes and answer conversion are there too);
- `sessions/` — token-in sessions: the sans-IO planner and what a session remembers.

Nothing outside the capture layer imports these modules except the collector that wires them;
the public surface of sessions is `tito_agents.sessions`.
"""

from tito_agents._capture.core import CaptureCore
from tito_agents._capture.episode import CapturedEpisode
from tito_agents._capture.pending import PendingCall
from tito_agents._capture.session_store import SessionStore
from tito_agents._capture.tee import Decompressor, StreamTee

__all__ = [
    "CaptureCore",
    "CapturedEpisode",
    "Decompressor",
    "PendingCall",
    "SessionStore",
    "StreamTee",
]

"""The capture core shared by the sync and async transports: decide, snapshot, parse, record.

Transports do only I/O; everything else happens here once: whether a request is captured, the
request rewrite, the attribution snapshot taken at request time (`core`), response parsing (a JSON
body, or an SSE stream watched by the `tee`) and turning parsed choices into `Call` records handed
to the episode. `pending` is the record of a request in flight; `episode` names what capture calls
on an episode (`CapturedEpisode`); `session_store` keeps the token-in sessions per (episode, agent).
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

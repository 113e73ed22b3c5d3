"""Token-in sessions, as a user sees them: the server never re-tokenizes what the model sampled.

With `collector.wrap(client, sessions=True)` (or `collector.http_client(sessions=True)`), a chat or Responses
request that only appends to an earlier turn of the same (episode, agent) is sent as a token
prompt: the earlier prompt ids + the ids the model sampled + the tokens of the new messages,
rendered by the server's own chat template. Anything else is rendered by the server as usual, and
the call says why (`Call.session_reason`, whose cause is one `FallbackReason`):

    reason = FallbackReason.of(call.session_reason)

How sessions work inside capture: `tito_agents/_capture/sessions/` (its package docstring);
for users: docs/sessions.md.
"""

from tito_agents._capture.sessions.reasons import FallbackReason

__all__ = ["FallbackReason"]

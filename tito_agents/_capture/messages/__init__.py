"""Anthropic Messages (`/v1/messages`), which vLLM serves by converting to chat: `convert` (the
request as vLLM's own chat conversion), `check` (what vLLM's request model accepts), `probe` (the
conversion choices read from the server's template), `reply` (a chat answer back as Messages
answers it) and `relay` (the probes' plan and the live stream relay)."""

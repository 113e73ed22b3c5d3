"""Anthropic Messages (`/v1/messages`), which vLLM serves by converting to chat: `request` (what
capture sends: the request as vLLM's own chat conversion, prepared as a chat request), `convert`
(that conversion), `check` (what vLLM's request model accepts), `probe` (the conversion choices
read from the server's template), `reply` (a chat answer back as Messages answers it), `relay`
(the probes' plan and the live stream relay) and `flow` (a Messages call's steps in the capture
flow: the probes sent, the chat answer converted back)."""

"""The Responses API (`/v1/responses`): `parser` reads its bodies and final stream event and keeps
the caller's view of a body; `chat_view` is the chat conversation vLLM renders a Responses
request as (token-in sessions plan Responses calls with it)."""

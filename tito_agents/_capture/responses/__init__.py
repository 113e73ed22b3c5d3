"""The Responses API (`/v1/responses`): `request` (what capture adds to a request:
`enable_response_messages`, the logprobs `include` entry and `top_logprobs: 0`), `parser` (its
bodies and final stream event, and which fields of a body the caller's copy has null again) and
`chat_view` (the chat conversation vLLM renders a Responses request as: token-in sessions plan
Responses calls with it)."""

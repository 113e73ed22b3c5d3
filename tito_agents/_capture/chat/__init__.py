"""Chat completions and completions (`/v1/chat/completions`, `/v1/completions`): `request` (what
capture adds to a request: `return_token_ids`, `logprobs` on demand) and `parser` (their bodies
and stream events: choices, ids, logprobs, usage; the caller's copy of a body)."""

"""Chat completions and completions (`/v1/chat/completions`, `/v1/completions`): `parser` reads
their bodies and stream events (choices, ids, logprobs, usage). Their request rewrite is the
common one in `wire/request.py`."""

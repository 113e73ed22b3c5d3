"""Token-in sessions: the server never re-tokenizes what the model sampled.

In session mode the capture layer keeps, per (episode, agent), the turns it has seen: the request
messages, the token prompt the server used, the ids it sampled and the assistant message it
returned. A later chat request that only appends to one of those turns (its messages = that turn's
messages + the assistant message that answered it + new messages) is turned into a token-in request:

    prompt = previous prompt ids + previous sampled ids [+ end-of-turn bridge] + delta

where `delta` are the tokens of the new messages, computed from the server's own chat template with
`/tokenize` (no local tokenizer): the conversation ending with the previous assistant turn (cut after
its end-of-turn token) and the same with the new messages and the generation prompt; the first must
be a prefix of the second, and hold as many end-of-turn tokens as the conversation so far (so the
cut is the end of the previous assistant turn, never an earlier one). That check runs the first
time each kind of tail (server, model, its roles, the tools) is appended, together with a third,
short render: a fixed one-message head, the previous assistant message and the new messages,
without tools. When that short render ends with exactly the same delta, later tails of the same
kind need only the short render (its cost does not grow with the conversation, and tool schemas,
which are slow to render, are left out); otherwise they need one render of the whole conversation,
cut after as many end-of-turn tokens as it already holds. A cut that does not fit forgets the kind
again, so the next tail of that kind is checked afresh. The prompt goes to vLLM 0.32 as
`kv_transfer_params.prompt_token_ids`, which replaces the rendered prompt while `messages` still
drive tool parsing, so the response stays an ordinary chat completion.

The end-of-turn token is known before the first append: unless given
(`Collector(end_of_turn_id=...)`), it is derived from the server's own template with the first
check's renders (`end_of_turn_renders`: a tiny conversation whose assistant text is "1", "2" and
"1."; the token right after the text, the same in all three, ends the turn) and kept per server and
model. A template that writes nothing after an assistant turn (GLM), or whose end-of-turn marker is
not one token of the served tokenizer, has no usable token: its sessions fall back, saying so.

Where the template does not preserve the prefix (stock templates that drop past reasoning or an
empty reasoning block: Qwen3, DeepSeek-R1, GLM), the call falls back with where the template
re-renders history and what fixes it, unless the collector opted into `SessionHistoryMode.SAMPLED`:
then the model keeps its own sampled tokens in context and only the new messages are rendered (the
whole render cut after the conversation's turn ends), noted `token_in_sampled`. The model then
sees history the way it sampled it, not the way its template would re-render it.

Anything else falls back to normal rendering for that call, with the reason recorded on the call
(`Call.session`): history that is not append-only, a server without `/tokenize` or one that
ignored the token prompt. Sampled ids are never re-encoded.

Responses API requests are planned here too, as the chat conversation the server renders them as
(`tito_agents._capture.responses.chat_view`: the request's `chat_view`, the response's output items as the
assistant message): one planner for both APIs.

The request side is a generator (`plan`) that yields the `/tokenize` payloads it needs and receives
their results, so the sync and async transports drive the same logic with their own I/O. Every
fallback names its cause, a `FallbackReason`, at the start of `Call.session_reason`.

Modules: `state` (what a session remembers, what a plan decides), `history` (which turn a request
appends to), `renders` (what the template does, read from its renders), `reasons` (why a call
falls back), `planner` (the plan, in named steps). The capture layer keeps the sessions, one per
(episode, agent): `tito_agents._capture.session_store`.
"""

from tito_agents._capture.sessions.history import find_parent, same_assistant, tools_key
from tito_agents._capture.sessions.planner import Plan, TokenizeRequests, plan
from tito_agents._capture.sessions.reasons import FallbackReason
from tito_agents._capture.sessions.renders import (
    END_OF_TURN_PROBES,
    TAIL_HEAD,
    TokenizeResults,
    derive_end_of_turn,
    end_of_turn_renders,
)
from tito_agents._capture.sessions.state import EndOfTurn, Session, SessionDecision, TailCheck, Turn

__all__ = [
    "END_OF_TURN_PROBES",
    "TAIL_HEAD",
    "EndOfTurn",
    "FallbackReason",
    "Plan",
    "Session",
    "SessionDecision",
    "TailCheck",
    "TokenizeRequests",
    "TokenizeResults",
    "Turn",
    "derive_end_of_turn",
    "end_of_turn_renders",
    "find_parent",
    "plan",
    "same_assistant",
    "tools_key",
]

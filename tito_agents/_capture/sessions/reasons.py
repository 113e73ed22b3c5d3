"""Why a call of a token-in session was rendered by the server: one `FallbackReason` per cause.

A fallback is never an error (the call is captured exactly either way), but the user needs to
know which cause it was and what fixes it. The cause is a `FallbackReason`; the text written on
the call (`Call.session_reason`) is the member's value followed by what is specific to that call
(counts, the roles appended, the exception, the fix), so logs stay readable prose while tests and
tools match the cause with `FallbackReason.of(call.session_reason)`, never with a phrase of it.
"""

from __future__ import annotations

from enum import StrEnum


class FallbackReason(StrEnum):
    """Why a request of a session episode was sent for the server to render (not token-in).

    Each value is the start of the reason written on the call; no value is a prefix of another,
    so `of` names the cause of any such text.
    """

    # what the request is
    NO_MESSAGES = "request has no messages"
    ECHO_OR_CONTINUE = "echo/continue_final_message request"
    NOT_APPEND_ONLY = (
        "history is not append-only (rewritten, trimmed or edited messages, or changed tools)"
    )
    NOT_A_CHAT_CONVERSATION = "the Responses request cannot be planned as a chat conversation"
    KV_TRANSFER_NOT_AN_OBJECT = "kv_transfer_params is not an object"
    OWN_TOKEN_PROMPT = "the request sets its own kv_transfer_params.prompt_token_ids"
    WIDE_INTEGERS = "the request holds integers beyond 64 bits"
    # what the server's template does
    NO_END_OF_TURN_TOKEN = "the template writes no end-of-turn token after an assistant turn"
    END_OF_TURN_NOT_ONE_TOKEN = (
        "the template's end-of-turn marker is not one token of the served tokenizer"
    )
    END_OF_TURN_UNKNOWN = "end-of-turn token not known yet"
    PREFIX_NOT_PRESERVED = "the template does not preserve the prefix"
    NO_END_OF_TURN_RENDERED = "the template renders no end-of-turn token after the turn"
    TURN_COUNT_MISMATCH = (
        "the template renders another number of end-of-turn tokens up to the previous assistant "
        "turn than the conversation so far holds"
    )
    FEWER_TURNS = "the rendering has fewer turns than the conversation"
    # what the server does
    TOKENIZE_FAILED = "the server's /tokenize failed"
    SERVER_IGNORES_TOKEN_PROMPT = "the server ignores kv_transfer_params.prompt_token_ids"
    TOKEN_PROMPT_IGNORED = "the server ignored the token prompt in kv_transfer_params"
    # what capture could not do (a bug or an unreadable request: the call stays exact)
    UNPLANNABLE_REQUEST = "the request could not be planned"
    PLANNING_FAILED = "session planning failed"
    TOKEN_PROMPT_NOT_ADDED = "the token prompt could not be added to the request"
    TURN_NOT_RECORDED = "the turn could not be recorded"

    def explain(self, detail: str | None = None) -> str:
        """The reason as written on the call: the value, then `detail` (what is specific to this
        call), or the fixed explanation some causes always carry (`_ALWAYS`)."""
        return self.value + (detail if detail is not None else _ALWAYS.get(self, ""))

    @classmethod
    def of(cls, reason: str | None) -> FallbackReason | None:
        """The cause a call's `session_reason` names (None: no fallback reason, e.g. a note of a
        token-in call, or no reason at all)."""
        if not reason:
            return None
        for member in _LONGEST_FIRST:
            if reason.startswith(member.value):
                return member
        return None


_ALWAYS: dict[FallbackReason, str] = {
    FallbackReason.NO_END_OF_TURN_TOKEN: (
        " (the next turn's header follows its text directly, as in GLM templates), so a turn's "
        "end cannot be cut; give Collector(end_of_turn_id=...) only if the model ends its turns "
        "with a token the template also renders there"
    ),
    FallbackReason.END_OF_TURN_NOT_ONE_TOKEN: (
        " (it merges with the text before it: the tokenizer lacks the template's special "
        "tokens), so a turn's end cannot be cut exactly; serve the tokenizer the template was "
        "written for (`tito-agents audit-template --tokenizer` reports this as a token boundary)"
    ),
    FallbackReason.END_OF_TURN_UNKNOWN: (
        " (the template refused the short conversation it is derived from and no turn has ended "
        "on EOS); give Collector(end_of_turn_id=...)"
    ),
    FallbackReason.KV_TRANSFER_NOT_AN_OBJECT: " (the request is sent as written)",
    FallbackReason.WIDE_INTEGERS: ", which /tokenize renders would change",
    FallbackReason.TOKEN_PROMPT_IGNORED: (
        " (needs vLLM >= 0.27); it rendered the messages instead"
    ),
}
"""The explanation a cause always carries (how it arises, what fixes it) when no detail is given."""

_LONGEST_FIRST = sorted(FallbackReason, key=lambda member: len(member.value), reverse=True)

"""The two errors of the Agents SDK integration, both in the `tito_agents` error tree."""

from __future__ import annotations

from tito_agents.errors import CaptureError, ConfigurationError

RESPONSES_FIX = (
    "use the chat-completions model: install(...) does it for the default client; pass "
    "run_config=capture.run_config() or give the agent "
    "OpenAIChatCompletionsModel(name, openai_client=capture.client)"
)


class ResponsesAPIError(ConfigurationError):
    """An agent's model uses the Responses API, which returns no token ids; raised before the call.

    vLLM adds `prompt_token_ids` / `token_ids` only to Chat Completions (and Completions); its
    Responses API has no equivalent, so such a call can never become a sample.
    """

    def __init__(self, agent: str, model: str) -> None:
        self.agent = agent
        self.model = model
        super().__init__(
            f"agent {agent!r} calls {model} through the Responses API, which returns no token "
            f"ids; fix: {RESPONSES_FIX}"
        )


class UncapturedModelCallError(CaptureError):
    """A model call of an agent went out without capture: the Responses API, a host that is not a
    vLLM host of the collector, a client that was never wrapped, or a non-OpenAI model class.

    Recorded on the episode (its exit raises `EpisodeCaptureError` under the default error policy)
    because it is seen only after the call, from the SDK's tracing spans.
    """

    def __init__(self, agent: str | None, kind: str) -> None:
        self.agent = agent
        self.kind = kind
        who = f"agent {agent!r}" if agent else "an agent"
        super().__init__(
            f"a {kind} call of {who} was not captured (no token ids): its model is not a "
            "chat-completions model on a wrapped client pointed at a vLLM host.",
            fix=f"{RESPONSES_FIX}; or install(..., uncaptured='count') to let such calls "
            "pass through, counted in capture.stats",
        )

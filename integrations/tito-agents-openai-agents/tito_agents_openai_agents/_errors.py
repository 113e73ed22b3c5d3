"""The error of the Agents SDK integration, in the `tito_agents` error tree."""

from __future__ import annotations

from tito_agents.errors import CaptureError

MODEL_FIX = (
    "give the agent a model on the captured client: install(...) makes it the SDK's default "
    "client; or OpenAIResponsesModel(name, openai_client=capture.client) (or "
    "OpenAIChatCompletionsModel)"
)


class UncapturedModelCallError(CaptureError):
    """A model call of an agent went out without capture: a host that is not a vLLM host of the
    collector, a client that was never wrapped, or a non-OpenAI model class (LiteLLM, ...).

    Recorded on the episode (its exit raises `EpisodeCaptureError` under the default error policy):
    before the call when the run's model-input filter can see the agent's model and client (an
    unwrapped client), or after it, from the SDK's tracing spans.
    """

    def __init__(self, agent: str | None, kind: str, client_url: str | None = None) -> None:
        self.agent = agent
        self.kind = kind
        self.client_url = client_url
        who = f"agent {agent!r}" if agent else "an agent"
        if client_url is not None:
            reason = (
                f"a {kind} call of {who} goes through an AsyncOpenAI client for {client_url} that "
                "tito does not capture (never wrapped, or its host is not a vLLM host of the "
                "collector)."
            )
            fix = (
                "wrap the client the agent's model holds before the run: collector.wrap(client) "
                "or tito_oa.install(collector, client); or build the model on capture.client"
            )
        else:
            reason = (
                f"a {kind} call of {who} was not captured (no token ids): its model is not an "
                "OpenAI model (Responses or Chat Completions) on a wrapped client pointed at a "
                "vLLM host."
            )
            fix = MODEL_FIX
        super().__init__(
            reason,
            fix=f"{fix}; or install(..., uncaptured='count') to let such calls pass through, "
            "counted in capture.stats",
        )

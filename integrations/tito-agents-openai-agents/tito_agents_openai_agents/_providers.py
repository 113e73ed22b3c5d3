"""Model providers of the integration: model names resolve to models on the wrapped client, and
an agent that names no model gets the installed model (or the first one the server lists)
instead of the SDK's default "gpt-…", which a vLLM server answers with 404."""

from __future__ import annotations

import threading
from typing import Literal

import openai
from agents import Model, ModelProvider, OpenAIChatCompletionsModel, OpenAIResponsesModel
from openai import AsyncOpenAI

from tito_agents import ConfigurationError

Api = Literal["responses", "chat_completions"]
"""Which OpenAI API the models call: the Responses API (the SDK's default, `OpenAIResponsesModel`)
or Chat Completions (`OpenAIChatCompletionsModel`). vLLM returns exact ids on both."""


def served_model(client: AsyncOpenAI) -> str:
    """The first model `client`'s server lists (`GET /models`), read once with a short-lived sync
    client: model resolution in the SDK is synchronous, and this runs once per provider."""
    try:
        with openai.OpenAI(
            base_url=str(client.base_url),
            api_key=client.api_key,
            organization=client.organization,
            timeout=30.0,
            max_retries=2,
        ) as lister:
            listed = lister.models.list().data
    except openai.OpenAIError as exc:
        raise ConfigurationError(
            f"an agent names no model and the model list of {client.base_url} could not be read "
            f"({type(exc).__name__}: {exc}); give install(..., model=...)"
        ) from exc
    if not listed:
        raise ConfigurationError(
            f"an agent names no model and {client.base_url} lists none; give install(..., model=...)"
        )
    return listed[0].id


class TitoModelProvider(ModelProvider):
    """A `ModelProvider` for `RunConfig(model_provider=...)`: every model name resolves to an
    `OpenAIResponsesModel` (or, with `api="chat_completions"`, an `OpenAIChatCompletionsModel`) on
    one (wrapped) client. Unlike the SDK's default provider it never reads "prefix/" in a name as a
    provider, so vLLM names like "org/model" work. An agent that names no model gets
    `default_model`, or else the first model the server lists."""

    def __init__(
        self, client: AsyncOpenAI, *, default_model: str | None = None, api: Api = "responses"
    ) -> None:
        if api not in ("responses", "chat_completions"):
            raise ConfigurationError(f"api must be 'responses' or 'chat_completions', not {api!r}")
        self.client = client
        self.default_model = default_model
        self.api: Api = api
        self._lock = threading.Lock()

    def model_name(self) -> str:
        """`default_model`, looked up on the server the first time it is needed."""
        if self.default_model is None:
            with self._lock:
                if self.default_model is None:
                    self.default_model = served_model(self.client)
        return self.default_model

    def get_model(self, model_name: str | None) -> Model:
        name = model_name or self.model_name()
        if self.api == "chat_completions":
            return OpenAIChatCompletionsModel(model=name, openai_client=self.client)
        return OpenAIResponsesModel(model=name, openai_client=self.client)


class DefaultModelProvider(ModelProvider):
    """A run's own provider, except that an agent naming no model gets the installed default
    (the SDK's own default provider would send "gpt-…" to the vLLM server)."""

    def __init__(self, inner: ModelProvider, fallback: TitoModelProvider) -> None:
        self.inner = inner
        self.fallback = fallback

    def get_model(self, model_name: str | None) -> Model:
        if model_name is None:
            return self.fallback.get_model(None)
        return self.inner.get_model(model_name)

    async def aclose(self) -> None:
        await self.inner.aclose()

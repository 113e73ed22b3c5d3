"""A fake vLLM serving several models by name (a base model and LoRA adapters, as
`vllm serve --enable-lora --lora-modules a=... b=...` does): one `FakeVLLM` per served name, the
request's `model` picking which answers; unknown names get vLLM's 404. For the policy routing
tests (tests/unit/test_policies*.py); each model answers with its own text, so a sample's tokens
tell which model sampled them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import openai
import orjson

from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, mock_transport
from tito_agents.testing.fake_vllm._core import FakeResponse

BASE = "SmolLM2-135M-Instruct"


class MultiModelFake:
    """Served names -> fakes; `bodies` keeps every request body received, in order."""

    def __init__(self, names: tuple[str, ...] = (BASE, "a", "b")) -> None:
        self.fakes = {
            name: FakeVLLM(FakeConfig(model=name, responder=_says(name))) for name in names
        }
        self.bodies: list[bytes] = []

    def handle(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> FakeResponse:
        self.bodies.append(body)
        model: Any = None
        if body:
            try:
                model = orjson.loads(body).get("model")
            except (orjson.JSONDecodeError, AttributeError):
                model = None
        fake = self.fakes.get(model) if isinstance(model, str) else None
        if fake is None:
            fake = self.fakes[BASE]  # it refuses an unknown name itself (vLLM's 404)
        return fake.handle(method, path, body, headers)

    def models_sent(self) -> list[Any]:
        """The `model` of each request body received."""
        return [orjson.loads(b).get("model") for b in self.bodies if b]

    def client(self, *, asynchronous: bool = False) -> Any:
        transport = mock_transport(self.handle)
        if asynchronous:
            return openai.AsyncOpenAI(
                base_url="http://vllm.test/v1",
                api_key="x",
                http_client=openai.DefaultAsyncHttpxClient(transport=transport),
            )
        return openai.OpenAI(
            base_url="http://vllm.test/v1",
            api_key="x",
            http_client=openai.DefaultHttpxClient(transport=transport),
        )


def _says(name: str) -> Any:
    def responder(view: Any) -> str:
        return f"I am {name}."

    return responder

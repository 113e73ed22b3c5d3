"""`wrap(llm, collector)`: every ChatOpenAI call path captures exact ids through the core transport."""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_openai import ChatOpenAI
from lc_support import MakeModel, decode, get_weather
from pydantic import BaseModel, SecretStr
from tito_agents_langchain import wrap

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeVLLMServer
from tito_agents.testing.smollm2 import MODEL_NAME


class City(BaseModel):
    name: str
    population: int


def text(message: Any) -> str:
    return message.content if isinstance(message.content, str) else ""


def merged(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


# Each path returns the texts the model answered, in input order (None: not a text answer).
async def path_invoke(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(llm.invoke(q[0]))]


async def path_ainvoke(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(await llm.ainvoke(q[0]))]


async def path_stream(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(merged(list(llm.stream(q[0]))))]


async def path_astream(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(merged([c async for c in llm.astream(q[0])]))]


async def path_batch(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(m) for m in llm.batch(list[LanguageModelInput](q))]


async def path_abatch(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(m) for m in await llm.abatch(list[LanguageModelInput](q))]


async def path_streaming_invoke(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    return [text(await llm.model_copy(update={"streaming": True}).ainvoke(q[0]))]


async def path_bind_tools(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    message = await llm.bind_tools([get_weather]).ainvoke(q[0])
    assert isinstance(message, AIMessage) and message.tool_calls[0]["name"] == "get_weather"
    return [None]


async def path_structured_json_schema(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    assert llm.with_structured_output(City).invoke(q[0]) == City(name="Paris", population=2100000)
    return [None]


async def path_structured_function_calling(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    out = await llm.with_structured_output(City, method="function_calling").ainvoke(q[0])
    assert isinstance(out, City)
    return [None]


async def path_structured_json_schema_stream(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    structured = llm.with_structured_output(City)
    assert [c async for c in structured.astream(q[0])][-1] == City(name="Paris", population=2100000)
    return [None]


async def path_structured_json_mode_stream(llm: ChatOpenAI, q: list[str]) -> list[str | None]:
    structured = llm.with_structured_output(City, method="json_mode")
    assert [c async for c in structured.astream(q[0])][-1] == City(name="Paris", population=2100000)
    return [None]


Path = Callable[[ChatOpenAI, list[str]], Awaitable[list[str | None]]]
PATHS: dict[str, tuple[Path, int]] = {
    "invoke": (path_invoke, 1),
    "ainvoke": (path_ainvoke, 1),
    "stream": (path_stream, 1),
    "astream": (path_astream, 1),
    "batch": (path_batch, 3),
    "abatch": (path_abatch, 3),
    "streaming=True invoke": (path_streaming_invoke, 1),
    "bind_tools": (path_bind_tools, 1),
    "with_structured_output json_schema": (path_structured_json_schema, 1),
    "with_structured_output function_calling": (path_structured_function_calling, 1),
    "with_structured_output json_schema astream": (path_structured_json_schema_stream, 1),
    "with_structured_output json_mode astream": (path_structured_json_mode_stream, 1),
}
# openai's own stream helper warns when it serializes the parsed object (unwrapped models too).
_OPENAI_PARSED_WARNING = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[_OPENAI_PARSED_WARNING] if "json_schema astream" in name else [])
        for name in PATHS
    ],
)
async def test_every_call_path_captures_exact_ids(
    name: str, make_model: MakeModel, collector: tito.Collector, tokenizer: Any
) -> None:
    """Each ChatOpenAI call path yields exactly one complete call per model call, whose prompt
    ids hold that call's own question and whose sampled ids decode to the answer LangChain got."""
    path, inputs = PATHS[name]
    llm = wrap(make_model(), collector)
    questions = [f"Question {i}: what is the weather in Paris?" for i in range(inputs)]
    async with collector.episode() as ep:
        answers = await path(llm, questions)
    assert len(ep.calls) == inputs
    assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)
    for question, answer in zip(questions, answers, strict=True):
        (call,) = [c for c in ep.calls if question in decode(tokenizer, c.prompt_ids)]
        sampled = decode(tokenizer, call.sampled_ids)
        assert sampled == answer if answer is not None else sampled
    assert len(captured_samples(collector)) == inputs


async def test_n_choices_are_one_request_and_n_calls(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A model with n=2 makes one request whose two choices become two calls."""
    llm = wrap(make_model(n=2, temperature=1.0), collector)
    async with collector.episode() as ep:
        result = await llm.agenerate([[HumanMessage("Say something about Tokyo.")]])
    assert len(result.generations[0]) == 2
    assert sorted(c.choice_index for c in ep.calls) == [0, 1]
    assert len({c.request_id for c in ep.calls}) == 1


async def test_runnables_built_before_wrap_capture_too(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """bind_tools / with_config runnables made before wrap() hold the same model and capture."""
    llm = make_model()
    bound = llm.bind_tools([get_weather]).with_config(tags=["x"])
    wrap(llm, collector)
    async with collector.episode() as ep:
        await bound.ainvoke("What is the weather in Oslo?")
    assert len(ep.calls) == 1


def test_responses_api_model_is_refused(fake_server: FakeVLLMServer) -> None:
    """A ChatOpenAI set up for the Responses API is refused, saying why token ids are unavailable."""
    collector = tito.Collector()
    settings: list[dict[str, Any]] = [
        {"use_responses_api": True, "api_key": "x"},
        {"output_version": "responses/v1", "api_key": "x"},
    ]
    for kwargs in settings:
        llm = ChatOpenAI(model=MODEL_NAME, base_url=fake_server.base_url, **kwargs)
        with pytest.raises(tito.ConfigurationError, match="return_token_ids"):
            wrap(llm, collector)


def test_wrap_pins_chat_completions(make_model: MakeModel, collector: tito.Collector) -> None:
    """wrap() sets use_responses_api=False so no per-call argument can route to /v1/responses."""
    llm = make_model()
    assert llm.use_responses_api is None
    assert wrap(llm, collector).use_responses_api is False


def test_wrap_refuses_other_models_and_the_openai_api() -> None:
    """wrap() accepts only a ChatOpenAI, and never one pointed at the official OpenAI API."""
    collector = tito.Collector()
    with pytest.raises(tito.ConfigurationError, match="ChatOpenAI"):
        wrap(FakeListChatModel(responses=["x"]), collector)  # type: ignore[type-var]
    official = ChatOpenAI(
        model="gpt-4o-mini", api_key=SecretStr("x"), base_url="https://api.openai.com/v1"
    )
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        wrap(official, collector)


async def test_other_models_sharing_the_default_client_are_not_captured(
    fake_server: FakeVLLMServer, collector: tito.Collector
) -> None:
    """Models sharing langchain-openai's cached HTTP client stay uncaptured when one is wrapped."""
    options: dict[str, Any] = {"model": MODEL_NAME, "api_key": "x", "max_tokens": 8}
    options["timeout"] = 7.25  # a cache entry of this test's own
    wrapped = ChatOpenAI(base_url=fake_server.base_url, **options)
    other = ChatOpenAI(base_url=fake_server.base_url, **options)
    assert wrapped.root_async_client._client is other.root_async_client._client
    wrap(wrapped, collector)
    async with collector.episode() as ep:
        await other.ainvoke("Hello there.")
        await wrapped.ainvoke("Hello again.")
    assert len(ep.calls) == 1 and collector.stats.requests == 1
    await other.root_async_client.close()  # the shared pool: closes both


async def test_wrapping_again_replaces_the_capture(make_model: MakeModel) -> None:
    """A second wrap() with another collector moves capture there; calls are never recorded twice."""
    first, second = tito.Collector(), tito.Collector()
    llm = wrap(wrap(make_model(), first), second)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both are outside any episode here
        await llm.ainvoke("Hello.")
        llm.invoke("Hello.")
    assert first.stats.requests == 0
    second.flush()  # calls outside an episode are written by the processor's thread
    assert second.stats.requests == 2 and len(captured_samples(second)) == 2

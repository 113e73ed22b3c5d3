"""What the verl agent-loop tests build verl's objects from, without GPUs: a tiny Hugging Face
model folder (the shipped SmolLM2 tokenizer beside a one-layer Llama config: verl's
`HFModelConfig` reads both, no weights), verl's own generated trainer config pointed at it, and
verl's own `LLMServerClient` and load balancer over given servers, Ray's actor calls done in
process (`LocalActor`).

Needs verl (tests/verl and tests/e2e/test_verl_loop_real.py import it only where it is
installed: `make test-verl`)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import verl
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap

from tests.support.weather import OBSERVATION, weather_answer
from tito_agents.rl.verl_loop import TitoAgentLoop
from tito_agents.testing.smollm2 import load_tokenizer, tokenizer_dir

PROMPT_LENGTH, RESPONSE_LENGTH = 256, 512


def model_dir(root: Path) -> Path:
    """A model folder verl's `HFModelConfig` accepts: SmolLM2's tokenizer and a tiny Llama config."""
    from transformers import LlamaConfig

    folder = root / "model"
    folder.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_dir()) / name, folder / name)
    LlamaConfig(
        vocab_size=49152,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(folder)
    return folder


def trainer_config(model: Path | None = None, agent_loop_config_path: Path | None = None) -> Any:
    """verl's generated PPO trainer config (the defaults a verl user starts from), with vLLM as
    the rollout, our lengths, the model folder and the agent-loop YAML."""
    config: DictConfig = OmegaConf.load(
        Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    )  # type: ignore[assignment]
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.prompt_length = PROMPT_LENGTH
    rollout.response_length = RESPONSE_LENGTH
    if model is not None:
        config.actor_rollout_ref.model.path = str(model)
    if agent_loop_config_path is not None:
        rollout.agent.agent_loop_config_path = str(agent_loop_config_path)
    return config


class LocalActor:
    """A Ray actor handle's calling convention over a local object: `handle.method.remote(...)`
    runs the method at once and returns a done future (awaited, or dropped as verl drops
    `release_server`'s). Lets verl's own `LLMServerClient` and `GlobalRequestLoadBalancer` run
    without a Ray cluster."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        def remote(*args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            future = asyncio.get_running_loop().create_future()
            future.set_result(method(*args, **kwargs))
            return future

        return SimpleNamespace(remote=remote)


def rollout_servers(*base_urls: str) -> tuple[Any, Any]:
    """verl's `LLMServerClient` over verl's `GlobalRequestLoadBalancer` of these servers (keyed
    by `host:port`, as `LLMServerManager` registers its replicas' addresses): (client, balancer)."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    balancer = GlobalRequestLoadBalancer(servers={address_of(url): None for url in base_urls})
    client = LLMServerClient(config=trainer_config(), load_balancer_handle=LocalActor(balancer))
    return client, balancer


def make_loop(
    server: Any,
    *,
    loop_class: type[TitoAgentLoop] = TitoAgentLoop,
    response_length: int = RESPONSE_LENGTH,
    **options: Any,
) -> Any:
    """A `TitoAgentLoop` built with the arguments verl's worker gives it (`options`: the YAML
    entry's keys, `agent` among them)."""
    config = trainer_config()
    config.actor_rollout_ref.rollout.response_length = response_length
    return loop_class(
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=load_tokenizer(),
        processor=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        **options,
    )


def address_of(base_url: str) -> str:
    """`http://host:port/v1` -> `host:port`, the form verl's server ids take."""
    return base_url.removeprefix("http://").removesuffix("/v1")


# ---- agents the tests name in their agent-loop YAML (`agent: tests.support.verl_loop:NAME`) ----


async def served_model(client: Any) -> str:
    """The model the server serves (verl's vLLM serves the model under its local path)."""
    models = await client.models.list()
    return str(models.data[0].id)


async def weather_agent(prompt: Any, client: Any, reward_model: Any = None) -> float:
    """A plain openai tool agent: calls the weather tool, reads the result, answers; reward 1
    when the answer holds the row's ground truth."""
    if not (isinstance(prompt, list) and all(type(m) is dict for m in prompt)):
        raise TypeError(f"the prompt is {type(prompt).__name__}, not a list of messages")
    answer = await weather_answer(client, await served_model(client), list(prompt))
    truth = (reward_model or {}).get("ground_truth", "sunny")
    return 1.0 if truth in answer else 0.0


async def short_agent(prompt: Any, client: Any) -> float:
    """One short chat call; reward 1 when the model said anything."""
    response = await client.chat.completions.create(
        model=await served_model(client), messages=list(prompt), max_tokens=8, temperature=1.0
    )
    return 1.0 if response.choices[0].message.content else 0.0


async def two_conversations(prompt: Any, client: Any) -> float:
    """Two calls whose histories do not chain: one episode of two linked segments."""
    model = await served_model(client)
    for text in ("First question?", "An unrelated second question?"):
        await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=8
        )
    return 0.75


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return OBSERVATION


async def langgraph_agent(prompt: Any, client: Any, base_url: str, collector: Any) -> float:
    """An unmodified LangGraph agent (LangChain's `create_agent`) whose `ChatOpenAI` is built
    from the loop's `base_url` and wrapped with its `collector`."""
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from tito_agents_langchain import wrap

    model = await served_model(client)
    # its own HTTP client, closed at the end (LangChain's default one lives for the process)
    async with openai.DefaultAsyncHttpxClient() as http:
        llm = ChatOpenAI(
            model=model, base_url=base_url, api_key="EMPTY", max_tokens=64, http_async_client=http
        )
        graph = create_agent(wrap(llm, collector), tools=[get_weather])
        result = await graph.ainvoke({"messages": prompt})
    return 1.0 if "sunny" in str(result["messages"][-1].content) else 0.0


async def agents_sdk_agent(prompt: Any, client: Any) -> float:
    """An unmodified OpenAI Agents SDK agent on the client the loop hands it."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    agent = Agent(
        name="weather",
        model=OpenAIChatCompletionsModel(model=await served_model(client), openai_client=client),
        model_settings=ModelSettings(max_tokens=64),
        tools=[function_tool(get_weather)],
    )
    result = await Runner.run(agent, prompt)
    return 1.0 if "sunny" in str(result.final_output) else 0.0

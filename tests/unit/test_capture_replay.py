"""Capture against real vLLM 0.32 server output (replayed in process), sync and async clients."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.captures import Capture, Replay, load_capture, replay_clients
from tito_agents import integration

ID_CAPTURES = [
    "chat_ns",
    "chat_ns_n2",
    "chat_ns_tokid",
    "chat_prefill",
    "chat_tokens_in",
    "chat_stream",
    "chat_stream_n2",
    "chat_stream_lp",
    "eos",
    "eos_noskip",
    "eos_stream",
    "eos_cmpl",
    "stop_tok",
    "stop_str",
    "stop_str_mid",
    "stop_str_incl",
    "stop_str_stream",
    "tool_auto",
    "tool_auto_stream",
    "tool_required",
    "tool_named",
    "multi_turn_tool",
    "cmpl_ns",
    "cmpl_ns_echo",
    "cmpl_multi",
    "cmpl_tokens_in",
    "cmpl_stream",
    "cmpl_stream_n2",
]


def expected_ids(cap: Capture) -> dict[int, tuple[list[int], list[int]]]:
    """Independently derive (prompt ids, sampled ids) per choice index from a capture."""
    out: dict[int, tuple[list[int], list[int]]] = {}
    chat = "messages" in cap.request
    if not cap.is_stream:
        body = cap.json()
        for choice in body["choices"]:
            prompt = body["prompt_token_ids"] if chat else choice["prompt_token_ids"]
            out[choice["index"]] = (prompt, choice["token_ids"])
        return out
    prompts: dict[int, list[int]] = {}
    sampled: dict[int, list[int]] = {}
    for event in cap.events():
        data = event.strip()[len(b"data: ") :]
        if data == b"[DONE]":
            continue
        chunk = json.loads(data)
        for choice in chunk["choices"]:
            i = choice["index"]
            holder = chunk if chat else choice
            if holder.get("prompt_token_ids") is not None and i not in prompts:
                prompts[i] = holder["prompt_token_ids"]
            sampled.setdefault(i, []).extend(choice.get("token_ids") or [])
    return {i: (prompts[i], sampled[i]) for i in prompts}


def split_request(request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """openai SDK arguments for a capture's request: vLLM-only fields go to extra_body."""
    req = dict(request)
    stream = bool(req.pop("stream", False))
    base = {k: req.pop(k) for k in ("model", "messages", "prompt") if k in req}
    base["extra_body"] = req
    return base, stream


def run_sync(client: Any, cap: Capture) -> Any:
    base, stream = split_request(cap.request)
    create = client.chat.completions.create if "messages" in base else client.completions.create
    result = create(**base, stream=stream)
    if stream:
        return [chunk for chunk in result]
    return result


async def run_async(client: Any, cap: Capture) -> Any:
    base, stream = split_request(cap.request)
    create = client.chat.completions.create if "messages" in base else client.completions.create
    result = await create(**base, stream=stream)
    if stream:
        return [chunk async for chunk in result]
    return result


@pytest.mark.parametrize("name", ID_CAPTURES)
def test_sync_capture_matches_server_ids(name: str) -> None:
    """Every captured call of a sync client holds exactly the ids the server returned, per choice."""
    cap = load_capture(name)
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode("ep") as ep:
        run_sync(client, cap)
    want = expected_ids(cap)
    assert {c.choice_index for c in ep.calls} == set(want)
    for call in ep.calls:
        assert call.status is tito.CallStatus.COMPLETE, call.error
        prompt, sampled = want[call.choice_index]
        assert call.prompt_ids.tolist() == prompt
        assert call.sampled_ids.tolist() == sampled
        assert call.stream is cap.is_stream
    assert len(collector.sink.samples) == len(want)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ID_CAPTURES)
async def test_async_capture_matches_server_ids(name: str) -> None:
    """The async client captures the same ids as the sync one, for every wire shape."""
    cap = load_capture(name)
    replay = Replay([cap])
    _, client = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    async with collector.episode("ep") as ep:
        await run_async(client, cap)
    want = expected_ids(cap)
    assert sorted(c.choice_index for c in ep.calls) == sorted(want)
    for call in ep.calls:
        prompt, sampled = want[call.choice_index]
        assert call.status is tito.CallStatus.COMPLETE, call.error
        assert call.prompt_ids.tolist() == prompt
        assert call.sampled_ids.tolist() == sampled


def test_caller_gets_identical_body() -> None:
    """The wrapped client hands the caller the server's bytes unchanged."""
    cap = load_capture("tool_auto")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    tito.Collector(capture_logprobs=False).wrap(client)
    base, _ = split_request(cap.request)
    raw = client.chat.completions.with_raw_response.create(**base)
    assert raw.http_response.content == cap.body
    parsed = raw.parse()
    assert parsed.choices[0].message.tool_calls[0].function.name == "get_weather"


async def test_caller_gets_identical_stream() -> None:
    """Streamed chunks reach the caller unchanged and in order."""
    cap = load_capture("tool_auto_stream")
    plain_replay, cap_replay = Replay([cap]), Replay([cap])
    _, plain = replay_clients(plain_replay)
    _, wrapped = replay_clients(cap_replay)
    tito.Collector(capture_logprobs=False).wrap(wrapped)
    plain_chunks = [c.model_dump() for c in await run_async(plain, cap)]
    wrapped_chunks = [c.model_dump() for c in await run_async(wrapped, cap)]
    assert wrapped_chunks == plain_chunks


def test_logprobs_are_captured_and_aligned() -> None:
    """Chat logprobs land on the sampled tokens, one per id (EOS included)."""
    cap = load_capture("eos")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    with collector.episode() as ep:
        run_sync(client, cap)
    call = ep.calls[0]
    body = cap.json()
    want = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    assert call.logprobs is not None
    assert call.logprobs.tolist() == pytest.approx(want, rel=1e-6)
    sample = collector.sink.samples[0]  # type: ignore[attr-defined]
    n_prompt = len(body["prompt_token_ids"])
    assert sample.logprobs[:n_prompt].tolist() == [0.0] * n_prompt
    assert sample.logprobs[n_prompt:].tolist() == pytest.approx(want, rel=1e-6)


async def test_streamed_logprobs_are_captured() -> None:
    """Per-chunk logprobs in a stream concatenate in the order of the ids."""
    cap = load_capture("chat_stream_lp")
    _, client = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=True)
    collector.wrap(client)
    async with collector.episode() as ep:
        await run_async(client, cap)
    call = ep.calls[0]
    assert call.status is tito.CallStatus.COMPLETE
    assert call.logprobs is not None and call.logprobs.shape == call.sampled_ids.shape


def test_request_gets_vllm_fields_without_overriding_the_caller() -> None:
    """return_token_ids and logprobs are added only when the caller did not set them."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    tito.Collector(capture_logprobs=True).wrap(client)
    with tito.Collector().episode():
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], logprobs=False
        )
    assert replay.received[0]["return_token_ids"] is True
    assert replay.received[0]["logprobs"] is True
    assert replay.received[1]["logprobs"] is False


def test_caller_opt_out_is_respected() -> None:
    """A caller that sets return_token_ids=false is not captured (and not overridden)."""
    cap = load_capture("chat_ns_plain")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client)
    with collector.episode() as ep:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            extra_body={"return_token_ids": False},
        )
    assert replay.received[0]["return_token_ids"] is False
    assert ep.calls == []
    assert collector.stats.skipped_requests == 1


def test_other_hosts_are_untouched() -> None:
    """Requests to hosts not marked as vLLM are sent unchanged and never captured."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector()
    collector.wrap(client, vllm_hosts=["other-host:8000"])
    with collector.episode() as ep:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert "return_token_ids" not in replay.received[0]
    assert "logprobs" not in replay.received[0]
    assert ep.calls == []


def test_official_openai_host_is_refused() -> None:
    """Marking api.openai.com as vLLM is a configuration error, raised at set-up."""
    client = openai.OpenAI(api_key="sk-x")
    with pytest.raises(tito.ConfigurationError, match="official OpenAI API"):
        tito.Collector().wrap(client)


def test_retried_request_yields_one_call() -> None:
    """A 503 then a 200: the SDK retries, the failed attempt is not a call, one sample results."""
    cap = load_capture("chat_ns")
    replay = Replay([503, 429, cap])
    client, _ = replay_clients(replay)
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode() as ep:
        client.with_options(max_retries=3).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}]
        )
    assert len(replay.received) == 3
    assert len(ep.calls) == 1
    assert collector.stats.failed_attempts == 2
    assert len(collector.sink.samples) == 1  # type: ignore[attr-defined]


def test_redelivered_response_is_deduplicated() -> None:
    """The same response id seen twice in one episode yields one call, counted as a duplicate."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode() as ep:
        for _ in range(2):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}]
            )
    assert len(ep.calls) == 1
    assert collector.stats.duplicate_calls == 1


def test_no_credentials_are_persisted(tmp_path: Any) -> None:
    """Neither the API key nor the Authorization header reaches a call record or the samples file."""
    cap = load_capture("chat_ns")
    replay = Replay([cap])
    client, _ = replay_clients(replay)
    out = tmp_path / "s.jsonl"
    collector = tito.Collector(out)
    collector.wrap(client)
    with collector.episode() as ep:
        run_sync(client, cap)
    collector.close()
    assert replay.headers[0]["authorization"] == "Bearer sk-secret-test-key"
    assert b"sk-secret" not in out.read_bytes()
    assert "sk-secret" not in repr(vars(ep)) + repr([c.__repr__() for c in ep.calls])
    for call in ep.calls:
        assert "sk-secret" not in json.dumps(
            {k: str(getattr(call, k)) for k in call.__slots__}  # type: ignore[attr-defined]
        )


def test_wrap_twice_does_not_stack() -> None:
    """Wrapping a client again swaps the collector instead of capturing each call twice."""
    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    first, second = tito.Collector(capture_logprobs=False), tito.Collector(capture_logprobs=False)
    first.wrap(client)
    second.wrap(client)
    with second.episode() as ep:
        run_sync(client, cap)
    assert len(ep.calls) == 1
    assert first.stats.requests == 0


def test_threads_keep_the_episode_with_bind() -> None:
    """A raw thread pool loses the episode; bind() and ContextThreadPoolExecutor carry it."""
    from concurrent.futures import ThreadPoolExecutor

    cap = load_capture("chat_ns")
    client, _ = replay_clients(Replay([cap]))
    collector = tito.Collector(capture_logprobs=False, outside_episode="ignore")
    collector.wrap(client)

    def call() -> None:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])

    with collector.episode() as ep, ThreadPoolExecutor(1) as raw_pool:
        raw_pool.submit(call).result()
        assert ep.calls == []
        raw_pool.submit(tito.bind(call)).result()
        assert len(ep.calls) == 1
    with collector.episode() as ep2, integration.ContextThreadPoolExecutor(1) as pool:
        pool.submit(call).result()
    assert len(ep2.calls) == 1


def test_agent_and_labels_are_snapshotted_at_request_time() -> None:
    """Calls carry the agent and labels that were current when the request was sent."""
    cap, other = load_capture("chat_ns"), load_capture("eos")
    client, _ = replay_clients(Replay([cap, other]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    with collector.episode(agent="solver") as ep:
        with tito.agent("planner"), tito.labels(node="plan", step=1):
            run_sync(client, cap)
        run_sync(client, other)
    call, later = ep.calls
    assert later.agent == "solver" and later.labels == {}
    assert call.agent == "planner"
    assert call.labels == {"node": "plan", "step": 1}
    assert collector.sink.samples[0].agent == "planner"  # type: ignore[attr-defined]


def test_concurrent_async_episodes_do_not_mix() -> None:
    """Concurrent asyncio episodes each get exactly their own call."""

    async def main() -> None:
        collector = tito.Collector(capture_logprobs=False)
        caps = [load_capture("chat_ns"), load_capture("eos")]
        clients = []
        for cap in caps:
            _, client = replay_clients(Replay([cap]))
            collector.wrap(client)
            clients.append(client)

        async def rollout(i: int) -> tito.Episode:
            async with collector.episode(f"ep{i}") as ep:
                await asyncio.sleep(0.001 * (i % 3))
                await run_async(clients[i % 2], caps[i % 2])
            return ep

        eps = await asyncio.gather(*(rollout(i) for i in range(50)))
        for i, ep in enumerate(eps):
            assert len(ep.calls) == 1
            assert ep.calls[0].episode_id == f"ep{i}"
            assert ep.calls[0].request_id == caps[i % 2].json()["id"]

    asyncio.run(main())


def test_resolvers_attribute_calls_and_explicit_scopes_win() -> None:
    """A registered resolver supplies episode, agent and labels; explicit scopes take precedence;
    a failing resolver never breaks the call."""
    cap, other = load_capture("chat_ns"), load_capture("eos")
    client, _ = replay_clients(Replay([cap, other]))
    collector = tito.Collector(capture_logprobs=False)
    collector.wrap(client)
    framework_episode = collector.episode("from-framework")

    def resolver() -> integration.Attribution:
        return integration.Attribution(framework_episode, "node-a", {"langgraph_step": 3, "x": 1})

    def broken() -> integration.Attribution:
        raise RuntimeError("resolver bug")

    integration.register_resolver(broken)
    integration.register_resolver(resolver)
    try:
        run_sync(client, cap)  # no explicit scope: the resolver's episode (never entered) gets it
        with collector.episode("explicit") as ep, tito.agent("planner"), tito.labels(x=2):
            run_sync(client, other)
    finally:
        integration.unregister_resolver(resolver)
        integration.unregister_resolver(broken)
    (framework_call,) = framework_episode.calls
    assert framework_call.agent == "node-a"
    assert framework_call.labels == {"langgraph_step": 3, "x": 1}
    (explicit_call,) = ep.calls
    assert explicit_call.agent == "planner"
    assert explicit_call.labels == {"langgraph_step": 3, "x": 2}

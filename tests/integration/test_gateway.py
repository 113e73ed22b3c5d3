"""The capture gateway (`tito-agents serve`) in front of the fake vLLM over real HTTP, driven by
the official openai client as a harness would drive it: given a base URL and nothing else."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import tito_agents as tito
from tests.support.gateway_harness import TOKEN, ServedGateway, echo_responder
from tito_agents.sinks import MemorySink
from tito_agents.sinks.harness import free_port
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer

MSG = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(tokenization="drift", responder=echo_responder)) as server:
        yield server


@pytest.fixture
def served(fake: FakeVLLMServer) -> Iterator[ServedGateway]:
    fake.faults.__init__()  # type: ignore[misc]  # every switch off
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, fake.base_url, read_timeout=5.0) as gateway:
        yield gateway
    collector.close()


def sink_of(served: ServedGateway) -> MemorySink:
    sink = served.collector.sink
    assert isinstance(sink, MemorySink)
    return sink


def client_for(base_url: str, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="agent-key", max_retries=0, **kwargs)  # type: ignore[arg-type]


def test_episode_by_base_url_json_and_stream_exact(
    served: ServedGateway, request: pytest.FixtureRequest
) -> None:
    control = served.control()
    opened = control.open("ep-1", task_id="t1")
    assert opened["base_url"] == "/episodes/ep-1/v1"
    client = client_for(served.url + opened["base_url"])
    request.addfinalizer(client.close)
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=MSG, max_tokens=24, extra_body={"return_token_ids": True}
    )
    prompt = (reply.model_extra or {})["prompt_token_ids"]
    sampled = (reply.choices[0].model_extra or {})["token_ids"]
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MSG, max_tokens=24, stream=True
    )
    streamed: list[int] = []
    stream_prompt: list[int] = []
    text, stream_id = "", ""
    for chunk in stream:
        stream_id = chunk.id
        stream_prompt = (chunk.model_extra or {}).get("prompt_token_ids") or stream_prompt
        for choice in chunk.choices:
            streamed += (choice.model_extra or {}).get("token_ids") or []
            text += choice.delta.content or ""
    assert text.startswith("You said: Say something.")
    report = control.close("ep-1", reward=1.0)
    assert report["status"] == "closed"
    assert (report["calls"], report["complete"], report["samples"]) == (2, 2, 2)
    samples = {s.call_ids[0]: s for s in sink_of(served).samples if s.episode_id == "ep-1"}
    assert set(samples) == {f"{reply.id}/0", f"{stream_id}/0"}
    assert samples[f"{reply.id}/0"].token_ids.tolist() == prompt + sampled
    assert samples[f"{stream_id}/0"].token_ids.tolist() == stream_prompt + streamed
    assert all(s.reward == 1.0 and s.task_id == "t1" for s in samples.values())


def test_control_api_needs_its_own_token(served: ServedGateway) -> None:
    """The agent's base URL and API key open nothing: no reward, no close, no report."""
    control = served.control()
    control.open("ep-auth")
    for token in ("agent-key", "x", TOKEN + "x"):
        other = served.control(token)
        assert other.reward("ep-auth", 1.0).status_code == 401
        assert other.report("ep-auth").status_code == 401
        response = other.http.post("/control/episodes/ep-auth/close", json={})
        assert response.status_code == 401
    report = control.report("ep-auth").json()
    assert report["status"] == "open" and report["reward"] is None


def test_header_addressing_agents_labels_and_per_call_rewards(served: ServedGateway) -> None:
    control = served.control()
    control.open("ep-h", labels={"run": "r7"}, agent="solver")
    with client_for(served.url + "/v1", default_headers={"X-Tito-Episode": "ep-h"}) as by_header:
        first = by_header.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)
    base = served.url + "/episodes/ep-h/agents/critic/v1"
    with client_for(base) as critic:
        second = critic.chat.completions.create(
            model=MODEL_NAME, messages=MSG, max_tokens=8, n=2, temperature=1.0, seed=3
        )
    assert len(second.choices) == 2  # n>1 passes through
    response = control.http.patch("/control/episodes/ep-h", json={"labels": {"turn": 2}})
    assert response.status_code == 200
    calls = control.http.get("/control/episodes/ep-h/calls").json()["calls"]
    assert [(c["agent"], c["status"]) for c in calls] == [
        ("solver", "complete"),
        ("critic", "complete"),
        ("critic", "complete"),
    ]
    assert control.reward("ep-h", 0.5, call=first.id).status_code == 200
    assert control.reward("ep-h", -1.0, call=f"{second.id}/1").status_code == 200
    assert control.reward("ep-h", 0.0, call="chatcmpl-none").status_code == 404
    report = control.close("ep-h", reward=2.0)
    assert report["calls"] == 3 and report["samples"] == 3
    samples = {s.call_ids[0]: s for s in sink_of(served).samples if s.episode_id == "ep-h"}
    rewards = {call_id: s.spans[0].reward for call_id, s in samples.items()}
    assert rewards == {f"{first.id}/0": 0.5, f"{second.id}/0": None, f"{second.id}/1": -1.0}
    assert {s.agent for s in samples.values()} == {"solver", "critic"}
    assert all(s.reward in (0.5, 2.0, -1.0) for s in samples.values())


def test_unknown_closed_and_lost_episodes_are_refused(served: ServedGateway) -> None:
    control = served.control()
    with (
        client_for(served.url + "/episodes/nope/v1") as client,
        pytest.raises(openai.NotFoundError, match="no open episode"),
    ):
        client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
    control.open("ep-closed")
    control.close("ep-closed")
    with (
        client_for(served.url + "/episodes/ep-closed/v1") as client,
        pytest.raises(openai.ConflictError, match="is closed"),
    ):
        client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
    assert (
        control.http.post("/control/episodes", json={"episode_id": "ep-closed"}).status_code == 409
    )
    assert control.http.post("/control/episodes", json={"episode_id": "a/b"}).status_code in (
        400,
        404,
    )
    # ids as the library takes them: an int is its decimal string, a float or a list is refused
    opened = control.http.post("/control/episodes", json={"episode_id": 7, "group_id": 3})
    assert opened.status_code == 201 and opened.json()["episode_id"] == "7"
    for bad in ({"episode_id": 1.5}, {"group_id": [1]}, {"agent": True}):
        assert control.http.post("/control/episodes", json=bad).status_code == 400, bad
    assert control.http.patch("/control/episodes/7", json={"agent": 2}).status_code == 200
    assert control.http.patch("/control/episodes/7", json={"agent": 2.5}).status_code == 400
    control.close("7")


def test_outside_episode_calls_follow_the_collector_policy(served: ServedGateway) -> None:
    with client_for(served.url + "/v1") as client:
        reply = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=6)
        models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    served.collector.flush()
    samples = [s for s in sink_of(served).samples if s.call_ids == [f"{reply.id}/0"]]
    assert len(samples) == 1 and samples[0].episode_id == "default"


def test_upstream_errors_pass_through_unchanged_and_are_reported(
    served: ServedGateway, fake: FakeVLLMServer
) -> None:
    control = served.control()
    control.open("ep-err")
    fake.faults.status_before_body = 429
    with client_for(served.url + "/episodes/ep-err/v1") as client:
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        assert caught.value.status_code == 429
        fake.faults.status_before_body = None
        with pytest.raises(openai.BadRequestError):  # vLLM's own 400, body and all
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=10**6)
    report = control.close("ep-err")
    assert report["calls"] == 0 and report["failed_requests"] == 2
    assert [f["status"] for f in report["upstream_failures"]] == [429, 400]


def test_upstream_down_or_slow_gets_a_server_error_and_the_report_says_so(
    fake: FakeVLLMServer,
) -> None:
    collector = tito.Collector(MemorySink())
    down = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    with ServedGateway(collector, down, connect_timeout=2.0) as served:
        control = served.control()
        control.open("ep-down")
        with (
            client_for(served.url + "/episodes/ep-down/v1") as client,
            pytest.raises(openai.InternalServerError) as caught,
        ):
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        assert caught.value.status_code == 503
        assert "unreachable" in str(caught.value)
        report = control.close("ep-down")
        assert report["failed_requests"] == 1
        assert report["upstream_failures"][0]["status"] == 503
    with ServedGateway(collector, fake.base_url, read_timeout=0.5) as served:
        control = served.control()
        control.open("ep-slow")
        fake.faults.latency_ms = 2000
        try:
            with (
                client_for(served.url + "/episodes/ep-slow/v1") as client,
                pytest.raises(openai.InternalServerError) as caught,
            ):
                client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=4)
        finally:
            fake.faults.latency_ms = 0
        assert caught.value.status_code == 504
        report = control.close("ep-slow")
        assert report["upstream_failures"][0]["status"] == 504
    collector.close()


def test_client_disconnect_mid_stream_is_incomplete_and_cancels_upstream(
    served: ServedGateway, fake: FakeVLLMServer
) -> None:
    control = served.control()
    control.open("ep-cut")
    fake.faults.token_latency_ms = 20
    before = fake.stats.disconnects
    with client_for(served.url + "/episodes/ep-cut/v1") as client:
        stream = client.chat.completions.create(
            model=MODEL_NAME, messages=MSG, max_tokens=200, stream=True
        )
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
    end = time.monotonic() + 10
    while fake.stats.disconnects == before and time.monotonic() < end:
        time.sleep(0.05)
    assert fake.stats.disconnects == before + 1  # the gateway dropped the upstream request
    report = control.close("ep-cut")
    assert (report["calls"], report["incomplete"], report["samples"]) == (1, 1, 0)
    assert report["abandoned"] == 1


def test_responses_api_is_forwarded_and_captured_like_chat(served: ServedGateway) -> None:
    """`/v1/responses` goes through the same generic route: captured as the core captures it."""
    control = served.control()
    control.open("ep-resp")
    with client_for(served.url + "/episodes/ep-resp/v1") as client:
        reply = client.responses.create(
            model=MODEL_NAME, input="Say something.", max_output_tokens=16
        )
        assert reply.output_text.startswith("You said: Say something.")
        stream = client.responses.create(
            model=MODEL_NAME, input="Say more.", max_output_tokens=16, stream=True
        )
        kinds = [event.type for event in stream]
    assert kinds[-1] == "response.completed"
    report = control.close("ep-resp")
    assert (report["calls"], report["complete"], report["samples"]) == (2, 2, 2), report


def test_streams_are_relayed_chunk_by_chunk(served: ServedGateway, fake: FakeVLLMServer) -> None:
    """Each event reaches the client as the upstream sends it: with 50 ms between events, the
    chunks arrive at the upstream's pace, not all at once at its end."""
    served.control().open("ep-relay")
    fake.faults.token_latency_ms = 50
    arrivals: list[float] = []
    try:
        with client_for(served.url + "/episodes/ep-relay/v1") as client:
            start = time.monotonic()
            stream = client.chat.completions.create(
                model=MODEL_NAME, messages=MSG, max_tokens=12, stream=True
            )
            for _ in stream:
                arrivals.append(time.monotonic() - start)
    finally:
        fake.faults.token_latency_ms = 0
    assert len(arrivals) >= 8
    assert arrivals[-1] - arrivals[0] > 0.3  # not a burst at the end
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sorted(gaps)[len(gaps) // 2] > 0.02  # events keep the upstream's pace


def test_no_credential_reaches_a_sample_or_a_log(
    fake: FakeVLLMServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent's API key goes upstream and nowhere else; the control token nowhere at all,
    whatever fails on the way (debug logging on for the gateway's whole stack)."""
    agent_key = "sk-agent-secret-0123456789"
    sink_path = tmp_path / "samples.jsonl"
    collector = tito.Collector(sink_path)
    caplog.set_level(logging.DEBUG)
    with ServedGateway(collector, fake.base_url, read_timeout=5.0) as served:
        control = served.control()
        control.open("ep-secret")
        with openai.OpenAI(
            base_url=served.url + "/episodes/ep-secret/v1", api_key=agent_key, max_retries=0
        ) as client:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=6)
            fake.faults.status_before_body = 500
            with pytest.raises(openai.InternalServerError):
                client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=6)
            fake.faults.status_before_body = None
        served.control("wrong-token").reward("ep-secret", 1.0)
        control.close("ep-secret")
    collector.close()
    stack = ("tito_agents", "uvicorn", "httpx", "httpcore", "starlette")
    logged = "\n".join(
        r.getMessage() + repr(r.args) for r in caplog.records if r.name.startswith(stack)
    )
    written = sink_path.read_text()
    assert "ep-secret" in written
    for secret in (agent_key, TOKEN, "wrong-token"):
        assert secret not in logged and secret not in written


def test_an_empty_episode_is_logged_with_advice_for_a_gateway_user(
    served: ServedGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """An episode closed with no call names what a gateway user should fix (the base URL, the
    episode header), not the in-process advice to wrap a client."""
    control = served.control()
    control.open("ep-empty")
    caplog.set_level(logging.WARNING, logger="tito_agents")
    assert control.close("ep-empty")["calls"] == 0
    [message] = [r.getMessage() for r in caplog.records if "ep-empty" in r.getMessage()]
    assert "/episodes/ep-empty/v1" in message and "X-Tito-Episode: ep-empty" in message
    assert "collector.wrap" not in message

"""A call its client abandoned is never a sample: through the gateway (a client that closes its
connection while the upstream works on a non-streamed answer; the openai SDK timing out and
retrying) and in process (a wrapped client timing out and retrying). The upstream holds the
request until its client goes away or the test releases it, so nothing here races a clock."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

import tito_agents as tito
from tests.support.gateway_harness import RecordingUpstream, ServedGateway, vllm_error, wait_for
from tito_agents.sinks import MemorySink
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import MODEL_NAME

MSG = [{"role": "user", "content": "Say something."}]
SDK_TIMEOUT_S = 4.0
"""The SDK's per-attempt timeout: the held attempt always runs into it; the answered retry must
come within it (a fake answer takes milliseconds; the fake is warmed up first)."""


@pytest.fixture
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as server:
        server.fake.handle("POST", "/v1/chat/completions", orjson.dumps({"messages": MSG}))
        yield server


@pytest.fixture
def served(upstream: RecordingUpstream) -> Iterator[ServedGateway]:
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, upstream.base_url, read_timeout=120.0) as gateway:
        yield gateway
    collector.close()


def samples_of(collector: tito.Collector) -> list[Any]:
    collector.flush()
    return captured_samples(collector)


def test_client_gone_while_waiting_cancels_upstream_and_writes_nothing(
    served: ServedGateway, upstream: RecordingUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that closes its connection while the upstream works on a non-streamed answer:
    the upstream request is cancelled (its connection dropped), the call is counted as abandoned,
    it is not a call and not a sample; the next call of the episode is captured as usual."""
    caplog.set_level(logging.INFO, logger="tito_agents.gateway")
    control = served.control()
    base = control.open("ep-a")["base_url"]
    upstream.hold(1)
    body = orjson.dumps({"model": MODEL_NAME, "messages": MSG, "max_tokens": 8})
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(
            f"POST {base}/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert upstream.arrived.wait(60), "the request never reached the upstream"
    wait_for(lambda: upstream.outcomes == ["dropped"], "the upstream request was cancelled")
    upstream.release()
    wait_for(lambda: control.report("ep-a").json()["abandoned"] == 1, "the gateway counted it")
    report = control.report("ep-a").json()
    assert (report["calls"], report["in_flight"], report["forwarded"]) == (0, 0, 0)
    assert served.collector.stats.failed_attempts == 1
    assert any("went away" in r.getMessage() for r in caplog.records)

    client = openai.OpenAI(base_url=served.url + base, api_key="k", max_retries=0)
    answer = client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
    final = control.close("ep-a", reward=1.0)
    assert (final["calls"], final["complete"], final["samples"], final["abandoned"]) == (1, 1, 1, 1)
    assert [s.call_ids for s in samples_of(served.collector)] == [[f"{answer.id}/0"]]
    client.close()


def test_sdk_timeout_and_retry_gives_one_sample_per_response(
    served: ServedGateway, upstream: RecordingUpstream
) -> None:
    """The openai SDK with a short timeout and one retry: the first attempt times out (the
    upstream holds it), the retry is answered. The agent received one response, the episode
    holds one sample, and the held attempt — released upstream only after the agent has its
    answer, as a slow vLLM finishes it — never becomes one."""
    control = served.control()
    base = control.open("ep-sdk")["base_url"]
    client = openai.OpenAI(
        base_url=served.url + base, api_key="k", timeout=SDK_TIMEOUT_S, max_retries=1
    )
    upstream.hold(1)
    answer = client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
    assert upstream.arrived.is_set()
    wait_for(lambda: upstream.outcomes == ["dropped"], "the timed-out attempt was cancelled")
    upstream.release()  # a gateway that kept waiting would now get (and record) an answer
    wait_for(lambda: control.report("ep-sdk").json()["in_flight"] == 0, "nothing in flight")
    final = control.close("ep-sdk", reward=1.0)
    assert (final["calls"], final["samples"], final["abandoned"]) == (1, 1, 1)
    assert [s.call_ids for s in samples_of(served.collector)] == [[f"{answer.id}/0"]]
    assert len(upstream.requests) == 2
    client.close()


def test_abandoned_answer_released_late_is_still_not_a_sample(
    served: ServedGateway, upstream: RecordingUpstream
) -> None:
    """The same with an async client whose task is cancelled (the harness gave up): one call
    made, none answered to the agent, no sample."""
    import asyncio

    control = served.control()
    base = control.open("ep-cancel")["base_url"]
    upstream.hold(1)

    async def give_up() -> None:
        client = openai.AsyncOpenAI(base_url=served.url + base, api_key="k", max_retries=0)
        call = asyncio.ensure_future(
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
        )
        await asyncio.to_thread(upstream.arrived.wait, 60)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await client.close()

    asyncio.run(give_up())
    wait_for(lambda: upstream.outcomes == ["dropped"], "the cancelled call was cancelled upstream")
    upstream.release()
    wait_for(lambda: control.report("ep-cancel").json()["abandoned"] == 1, "counted")
    final = control.close("ep-cancel")
    assert (final["calls"], final["samples"], final["in_flight"]) == (0, 0, 0)
    assert samples_of(served.collector) == []


def test_in_process_timeout_and_retry_gives_one_sample(upstream: RecordingUpstream) -> None:
    """`collector.wrap(openai client)` with a short timeout and one retry against a slow
    upstream: the timed-out attempt is a failed attempt, never a sample; the retry is one."""
    collector = tito.Collector(MemorySink())
    client = collector.wrap(
        openai.OpenAI(base_url=upstream.base_url, api_key="k", timeout=SDK_TIMEOUT_S, max_retries=1)
    )
    upstream.hold(1)
    with collector.episode("in-process") as episode:
        answer = client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
        wait_for(lambda: upstream.outcomes == ["dropped"], "the timed-out attempt was dropped")
        upstream.release()
    assert (episode.report.calls, episode.report.samples) == (1, 1)
    assert [s.call_ids for s in samples_of(collector)] == [[f"{answer.id}/0"]]
    assert collector.stats.failed_attempts == 1
    client.close()
    collector.close()


def test_an_internal_failure_is_a_json_500_with_its_cause_logged(
    served: ServedGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A fault inside the gateway (injected into forwarding, then into the control API): the
    client gets a 500 in vLLM's shape (which the SDK reads as a server error), the log has the
    cause with its traceback, and the gateway goes on serving."""
    from tito_agents.gateway._forward import Forwarder
    from tito_agents.gateway._registry import Registry

    control = served.control()
    base = control.open("ep-500")["base_url"]

    async def broken_send(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected forwarding fault")

    caplog.set_level(logging.ERROR, logger="tito_agents.gateway")
    with monkeypatch.context() as patch:
        patch.setattr(Forwarder, "send", broken_send)
        client = openai.OpenAI(base_url=served.url + base, api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
        response = raised.value.response
        assert response.headers["content-type"] == "application/json"
        assert "RuntimeError" in vllm_error(response.content, 500)["message"]

        def broken_report(self: Registry, episode_id: str) -> Any:
            raise KeyError("injected control fault")

        patch.setattr(Registry, "report", broken_report)
        failed = control.report("ep-500")
        assert failed.status_code == 500
        vllm_error(failed.content, 500)
    causes = [r.exc_info[1] for r in caplog.records if r.exc_info and r.exc_info[1]]
    assert any("injected forwarding fault" in str(c) for c in causes)
    assert any("injected control fault" in str(c) for c in causes)
    answer = client.chat.completions.create(model=MODEL_NAME, messages=MSG, max_tokens=8)  # type: ignore[arg-type]
    assert answer.choices and control.close("ep-500")["samples"] == 1
    client.close()


def test_a_wrongly_typed_field_never_gets_a_bare_500(served: ServedGateway) -> None:
    """`"n": "two"`: whatever the answer (vLLM's own 400 once capture lets it through), it is
    JSON in vLLM's shape, never the server's plain-text 500."""
    control = served.control()
    base = control.open("ep-n")["base_url"]
    response = control.http.post(
        base + "/chat/completions",
        json={"model": MODEL_NAME, "messages": MSG, "n": "two"},
        headers={"authorization": "Bearer agent-key"},
    )
    assert response.headers["content-type"].startswith("application/json"), response.text
    if response.status_code >= 400:
        vllm_error(response.content, response.status_code)

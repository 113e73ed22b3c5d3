"""The control API and episode routing given what a careless driver or an attacker sends: misspelt
or unknown fields, missing required ones, a refused request that half-applied, labels nested too
deep for any JSON writer, a close racing another close, methods a path does not take, agent names
in UTF-8 headers. Each is answered 2xx with its effect or a one-line 4xx that changes nothing;
never a 500, a silently ignored field or an episode stuck with a report that cannot be read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import tito_agents as tito
from tests.support.gateway_harness import ServedGateway, echo_responder, vllm_error
from tito_agents.sinks import MemorySink
from tito_agents.testing.fake_vllm import MODEL_NAME, FakeConfig, FakeVLLMServer

CALL = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVLLMServer]:
    with FakeVLLMServer(FakeConfig(responder=echo_responder)) as server:
        yield server


@pytest.fixture
def served(fake: FakeVLLMServer) -> Iterator[ServedGateway]:
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, fake.base_url, read_timeout=5.0) as gateway:
        yield gateway
    collector.close()


def refused(response: httpx.Response, status: int, says: str) -> None:
    """A one-line vLLM-shaped error with `status`, whose message contains `says`."""
    assert response.status_code == status, response.text
    message = vllm_error(response.content, status)["message"]
    assert says in message and "\n" not in message, message


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels - 1):
        value = [value]
    return {"k": value}  # `levels` deep, the object itself included


def test_unknown_or_misspelt_fields_are_refused_and_change_nothing(served: ServedGateway) -> None:
    control = served.control().http
    refused(control.post("/control/episodes", json={"episode": "ep-x"}), 400, "'episode'")
    assert control.get("/control/episodes").json()["open"] == []  # no random-id episode opened
    assert control.post("/control/episodes", json={"episode_id": "ep"}).status_code == 201
    refused(control.patch("/control/episodes/ep", json={"lables": {"a": 1}}), 400, "'lables'")
    assert control.post("/control/episodes/ep/reward", json={"reward": 0.5}).status_code == 200
    # a reward request without "reward" is refused and leaves the reward as it was
    refused(control.post("/control/episodes/ep/reward", json={"rewrad": 1}), 400, "'rewrad'")
    refused(control.post("/control/episodes/ep/reward", json={}), 400, "'reward'")
    refused(control.post("/control/episodes/ep/reward", content=b""), 400, "'reward'")
    assert control.get("/control/episodes/ep").json()["reward"] == 0.5
    # a misspelt close does not close the episode without its reward
    refused(control.post("/control/episodes/ep/close", json={"rewrad": 1.0}), 400, "'rewrad'")
    assert control.get("/control/episodes/ep").json()["status"] == "open"
    closed = control.post("/control/episodes/ep/close", json={"reward": 1.0})
    assert (closed.status_code, closed.json()["reward"]) == (200, 1.0)
    # the weights' label is not cleared by a body that does not name it
    assert control.put("/control/policy-version", json={"policy_version": "7"}).status_code == 200
    refused(control.put("/control/policy-version", json={"version": "8"}), 400, "'version'")
    refused(control.put("/control/policy-version", json={}), 400, "'policy_version'")
    assert served.collector.settings.policy_version == "7"
    cleared = control.put("/control/policy-version", json={"policy_version": None})
    assert cleared.json() == {"policy_version": None}  # null still clears it, as documented
    refused(
        control.put("/control/policies", json={"policies": {"a": "m"}, "versions": {}}),
        400,
        "'versions'",
    )
    assert control.get("/control/policies").json()["policies"] == {}


def test_a_refused_patch_changes_nothing(served: ServedGateway) -> None:
    control = served.control().http
    control.post("/control/episodes", json={"episode_id": "ep", "agent": "solver"})
    answer = control.patch("/control/episodes/ep", json={"agent": "critic", "labels": [1]})
    refused(answer, 400, "labels must be a JSON object")
    assert control.get("/control/episodes/ep").json()["agent"] == "solver"


def test_labels_and_metadata_nested_too_deep_are_refused_where_they_come_in(
    served: ServedGateway,
) -> None:
    """Labels 300 deep are refused up front: JSON writers stop at 254 levels, so once taken, every
    report of the episode and its close would answer 500 and the sink would refuse its samples."""
    control = served.control().http
    for key in ("labels", "metadata"):
        body = {"episode_id": "deep", key: nested(300)}
        refused(control.post("/control/episodes", json=body), 400, f"{key} is nested")
    raw = b'{"metadata": {"k": ' + b"[" * 900 + b"]" * 900 + b"}}"  # under the parser's limit
    refused(control.post("/control/episodes", content=raw), 400, "metadata is nested")
    assert control.get("/control/episodes").json()["open"] == []
    control.post("/control/episodes", json={"episode_id": "ep"})
    refused(control.patch("/control/episodes/ep", json={"labels": nested(300)}), 400, "nested")
    assert control.get("/control/episodes/ep").status_code == 200
    assert control.post("/control/episodes/ep/close", json={}).status_code == 200
    assert control.get("/control/episodes/ep").json()["status"] == "closed"


def test_labels_and_metadata_at_the_depth_limit_reach_a_file_sink(
    fake: FakeVLLMServer, tmp_path: Path
) -> None:
    """The limit leaves room for the sample around them: 64 levels are written."""
    out = tmp_path / "samples.jsonl"
    collector = tito.Collector(str(out))
    with ServedGateway(collector, fake.base_url, read_timeout=5.0) as served:
        control = served.control().http
        body = {"episode_id": "ep", "labels": nested(64), "metadata": nested(64)}
        assert control.post("/control/episodes", json=body).status_code == 201
        refused(control.patch("/control/episodes/ep", json={"labels": nested(65)}), 400, "64")
        answer = httpx.post(served.url + "/episodes/ep/v1/chat/completions", json=CALL, timeout=60)
        assert answer.status_code == 200
        report = control.post("/control/episodes/ep/close", json={"reward": 1.0})
        assert (report.status_code, report.json()["samples"]) == (200, 1)
    collector.close()
    (line,) = out.read_bytes().splitlines()
    metadata = orjson.loads(line)["metadata"]
    assert metadata["k"] == nested(64)["k"] and metadata["labels"] == nested(64)


def test_a_close_while_another_close_writes_the_episode_is_a_conflict(
    served: ServedGateway,
) -> None:
    """Used to answer 404 ("no open episode"), as if the id were unknown."""
    control = served.control().http
    control.post("/control/episodes", json={"episode_id": "ep"})
    held = served.gateway.registry.open["ep"]
    held.closing = True  # the state while the first close assembles and writes (off the loop)
    try:
        refused(control.post("/control/episodes/ep/close", json={}), 409, "is being closed")
    finally:
        held.closing = False
    assert control.post("/control/episodes/ep/close", json={}).status_code == 200


def test_a_wrong_method_is_answered_with_every_method_the_path_takes(
    served: ServedGateway,
) -> None:
    control = served.control().http
    control.post("/control/episodes", json={"episode_id": "ep"})
    answer = control.delete("/control/episodes/ep")
    refused(answer, 405, "Method Not Allowed")
    assert set(answer.headers["allow"].split(", ")) == {"GET", "HEAD", "PATCH"}
    answer = control.put("/control/episodes", json={})
    assert set(answer.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}
    # both methods of each path still reach their handler (HEAD as GET, without a body)
    assert control.patch("/control/episodes/ep", json={"labels": {"a": 1}}).status_code == 200
    assert control.get("/control/episodes/ep").json()["labels"] == {"a": 1}
    assert control.head("/control/episodes/ep").status_code == 200
    assert [e["episode_id"] for e in control.get("/control/episodes").json()["open"]] == ["ep"]
    assert httpx.delete(served.url + "/control/episodes/ep").status_code in (401, 405)


def test_an_agent_name_in_a_utf8_header_is_the_name_sent(served: ServedGateway) -> None:
    """Starlette decodes headers as latin-1, which would record `X-Tito-Agent: réviseur` sent as
    UTF-8 as `rÃ©viseur`; it names the same agent as the URL form `agents/r%C3%A9viseur/v1`."""
    control = served.control().http
    control.post("/control/episodes", json={"episode_id": "ep"})
    by_header = httpx.post(
        served.url + "/v1/chat/completions",
        json=CALL,
        headers={"X-Tito-Episode": "ep", "X-Tito-Agent": "réviseur".encode()},
        timeout=60,
    )
    assert by_header.status_code == 200, by_header.text
    by_url = httpx.post(
        served.url + "/episodes/ep/agents/r%C3%A9viseur/v1/chat/completions", json=CALL, timeout=60
    )
    assert by_url.status_code == 200
    calls = control.get("/control/episodes/ep/calls").json()["calls"]
    assert [c["agent"] for c in calls] == ["réviseur", "réviseur"]
    not_utf8 = httpx.post(
        served.url + "/v1/chat/completions",
        json=CALL,
        headers={"X-Tito-Episode": "ep", "X-Tito-Agent": b"r\xe9viseur"},
        timeout=60,
    )
    refused(not_utf8, 400, "not UTF-8")
    assert control.post("/control/episodes/ep/close", json={}).json()["calls"] == 2

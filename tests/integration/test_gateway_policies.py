"""One policy per agent through the gateway: an agent's base URL (`/episodes/{id}/agents/{name}/v1`)
names the agent, the collector's mapping sends its calls to its adapter; the control API reads
and sets the mapping and the versions per policy."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import tito_agents as tito
from tests.support.gateway_harness import Control, ServedGateway, serve_cli
from tito_agents.calls import policy_of
from tito_agents.sinks import MemorySink
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

MSG: Any = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def adapter_a() -> Iterator[FakeVLLMServer]:
    """An upstream serving only the name "a" (as an adapter): a call naming anything else 404s."""
    with FakeVLLMServer(FakeConfig(model="a")) as server:
        yield server


def test_agent_urls_route_to_their_policy(adapter_a: FakeVLLMServer) -> None:
    sink = MemorySink()
    collector = tito.Collector(sink, policies={"planner": "a"})
    with ServedGateway(collector, adapter_a.base_url, read_timeout=5.0) as served:
        control = served.control()
        opened = control.open("ep-1", group_id="g")
        assert opened["agents"] == {
            "planner": {"base_url": "/episodes/ep-1/agents/planner/v1", "policy": "a"}
        }
        answer = control.http.put(
            "/control/policy-version", json={"policy": "a", "policy_version": "4"}
        )
        assert answer.json() == {"policy": "a", "policy_version": "4"}
        planner = openai.OpenAI(
            base_url=served.url + opened["agents"]["planner"]["base_url"],
            api_key="x",
            max_retries=0,
        )
        reply = planner.chat.completions.create(model="anything", messages=MSG, max_tokens=8)
        assert reply.model == "a"
        other = openai.OpenAI(
            base_url=served.url + "/episodes/ep-1/agents/other/v1", api_key="x", max_retries=0
        )
        with pytest.raises(openai.NotFoundError):  # not mapped: sent as written
            other.chat.completions.create(model="anything", messages=MSG, max_tokens=8)
        calls = control.http.get("/control/episodes/ep-1/calls").json()
        assert [(c["agent"], c["policy"]) for c in calls["calls"]] == [("planner", "a")]
        control.close("ep-1", reward=1.0)
        # the mapping is read and replaced through the control API
        assert control.http.get("/control/policies").json() == {
            "policies": {"planner": "a"},
            "policy_versions": {"a": "4"},
        }
        replaced = control.http.put("/control/policies", json={"policies": {"critic": "a"}})
        assert replaced.json()["policies"] == {"critic": "a"}
        both = {"policies": {"critic": "a"}, "policy_versions": {"a": 5}}
        assert control.http.put("/control/policies", json=both).json() == {
            "policies": {"critic": "a"},
            "policy_versions": {"a": "5"},  # an int label is stored as its string
        }
        for bad in (
            {"policies": {"critic": 3}},
            {"polices": {}},
            {},
            [],
            {"policies": "a"},
            {"policies": {}, "policy_versions": {"a": 1.5}},
            {"policies": {}, "policy_versions": "5"},
        ):
            refused = control.http.put("/control/policies", json=bad)
            assert refused.status_code == 400, bad  # and nothing changed
        assert control.http.get("/control/policies").json() == both | {
            "policy_versions": {"a": "5"}
        }
        bad_label = control.http.put("/control/policy-version", json={"policy_version": 2.5})
        assert bad_label.status_code == 400
        step = control.http.put("/control/policy-version", json={"policy_version": 12})
        assert step.json() == {"policy_version": "12"}
        planner.close()
        other.close()
    collector.close()
    (sample,) = sink.samples
    assert (sample.agent, policy_of(sample), sample.spans[0].policy_version) == (
        "planner",
        "a",
        "4",
    )


def test_serve_takes_the_mapping_and_versions_per_policy(
    adapter_a: FakeVLLMServer, tmp_path: Path
) -> None:
    """`tito-agents serve --policy AGENT=MODEL --policy-version POLICY=LABEL`: the command line
    builds the same mapping as `Collector(policies=..., policy_versions=...)`."""
    extra = ("--policy", "planner=a", "--policy-version", "a=7", "--policy-version", "base")
    with serve_cli(adapter_a.base_url, tmp_path / "s.jsonl", tmp_path / "state", *extra) as (
        _,
        url,
    ):
        control = Control(url)
        assert control.http.get("/control/policies").json() == {
            "policies": {"planner": "a"},
            "policy_versions": {"a": "7"},
        }
        control.http.close()


@pytest.mark.parametrize(
    "extra",
    [
        ("--policy", "planner"),
        ("--policy", "p=a", "--policy", "p=b"),
        ("--policy-version", "x", "--policy-version", "y"),
    ],
)
def test_serve_refuses_a_bad_mapping(tmp_path: Path, extra: tuple[str, ...]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tito_agents.cli",
            "serve",
            "--upstream",
            "http://127.0.0.1:9/v1",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--policy" in done.stderr

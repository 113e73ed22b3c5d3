"""One policy per agent (`Collector(policies=...)`): each agent's requests sent to its model / LoRA
adapter (the `model` field spliced into the caller's bytes), calls and samples tagged with the
policy, versions per policy, GRPO groups per (policy, group)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import orjson
import pytest

import tito_agents as tito
from tests.support.policies_fake import BASE, MultiModelFake
from tito_agents._capture.wire import prepare_request
from tito_agents.calls import Endpoint, policy_of
from tito_agents.config import CollectorSettings
from tito_agents.convert import group_advantages, group_key
from tito_agents.errors import ConfigurationError
from tito_agents.sinks import read_samples
from tito_agents.testing import captured_samples

MSG = [{"role": "user", "content": "hi"}]
POLICIES = {"planner": "a", "coder": "b"}


# ---- the request: only `model` changes, in place ----


def test_model_is_spliced_and_every_other_byte_kept() -> None:
    body = (
        b'{"model": "gpt-4o", "seed": 123456789012345678901, "temperature": 1.0e0, "messages": []}'
    )
    new, info = prepare_request(Endpoint.CHAT, body, capture_logprobs=False, model="a") or (
        None,
        None,
    )
    assert new is not None and info is not None
    assert new == body.replace(b'"gpt-4o"', b'"a"')[:-1] + b',"return_token_ids":true}'
    assert info.routed_from == "gpt-4o"
    assert info.payload is not None and info.payload["model"] == "a"


def test_model_added_when_absent_and_kept_when_already_the_policy() -> None:
    new, info = prepare_request(
        Endpoint.COMPLETIONS, b'{"prompt":"x"}', capture_logprobs=False, model="a"
    ) or (None, None)
    assert new is not None and orjson.loads(new)["model"] == "a"
    assert info is not None and info.routed_from is None  # nothing replaced
    same = b'{"model":"a","prompt":"x","return_token_ids":true}'
    prepared = prepare_request(Endpoint.COMPLETIONS, same, capture_logprobs=False, model="a")
    assert prepared is not None and prepared[0] is None  # nothing to add, nothing changed


def test_responses_and_messages_requests_are_routed() -> None:
    body = b'{"model":"m","input":"hi"}'
    new, info = prepare_request(Endpoint.RESPONSES, body, capture_logprobs=True, model="b") or (
        None,
        None,
    )
    assert new is not None and info is not None
    sent = orjson.loads(new)
    assert sent["model"] == "b" and sent["enable_response_messages"] is True
    assert info.routed_from == "m"
    messages = b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
    new, info = prepare_request(Endpoint.MESSAGES, messages, capture_logprobs=False, model="b") or (
        None,
        None,
    )
    assert new is not None and orjson.loads(new)["model"] == "b"
    assert info is not None and info.routed_from == "m"


# ---- the collector ----


def _run(fake: MultiModelFake, collector: tito.Collector, agents: tuple[str | None, ...]) -> None:
    client = collector.wrap(fake.client())
    with collector.episode("e1", group_id="g") as ep:
        for agent in agents:
            with tito.agent(agent) if agent else tito.labels():
                client.chat.completions.create(model=BASE, messages=MSG, max_tokens=8)
        ep.set_reward(1.0)


def test_each_agent_goes_to_its_adapter_and_samples_carry_it(caplog: Any) -> None:
    fake = MultiModelFake()
    with (
        caplog.at_level(logging.INFO, logger="tito_agents"),
        tito.Collector(
            policies=POLICIES, policy_versions={"a": "7"}, policy_version="1"
        ) as collector,
    ):
        _run(fake, collector, ("planner", "coder", "other", "planner"))
        samples = captured_samples(collector)
    assert fake.models_sent() == ["a", "b", BASE, "a"]
    by_agent = {(s.agent, policy_of(s), s.model, s.spans[0].policy_version) for s in samples}
    assert by_agent == {
        ("planner", "a", "a", "7"),
        ("coder", "b", "b", "1"),
        ("other", None, BASE, "1"),
    }
    sampled = {s.model: s.token_ids[s.spans[0].start :].tolist() for s in samples}
    assert len({str(ids) for ids in sampled.values()}) == 3  # each model said its own name
    # the mapping wins over the model the caller named; said once per (agent, model, policy)
    routed = [r for r in caplog.records if "sent to its policy" in r.getMessage()]
    assert len(routed) == 2


def test_calls_carry_policy_and_labels_are_not_shared() -> None:
    fake = MultiModelFake()
    with tito.Collector(policies=POLICIES) as collector:
        client = collector.wrap(fake.client())
        with collector.episode("e1") as ep, tito.agent("planner"), tito.labels(step=1):
            client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
        (call,) = ep.calls
    assert call.policy == "a"
    assert call.labels == {"step": 1}  # the policy is a field, not a label


def test_no_mapping_changes_nothing() -> None:
    fake = MultiModelFake()
    with tito.Collector() as collector:
        _run(fake, collector, ("planner", None))
        samples = captured_samples(collector)
    assert fake.models_sent() == [BASE, BASE]
    assert all(policy_of(s) is None and "labels" not in s.metadata for s in samples)
    assert all(b'"model":"SmolLM2-135M-Instruct"' in body for body in fake.bodies)


def test_a_hook_routes_by_agent_and_labels() -> None:
    def hook(agent: str | None, labels: Any) -> str | None:
        return "b" if labels.get("role") == "critic" else None

    fake = MultiModelFake()
    with tito.Collector(policies=hook) as collector:
        client = collector.wrap(fake.client())
        with collector.episode("e1") as ep:
            with tito.labels(role="critic"):
                client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
            client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
        assert [c.policy for c in ep.calls] == ["b", None]
    assert fake.models_sent() == ["b", BASE]


def test_async_clients_route_and_mapping_changes_apply_from_the_next_request() -> None:
    fake = MultiModelFake()

    async def main() -> list[Any]:
        async with tito.Collector(policies={"planner": "a"}) as collector:
            client = collector.wrap(fake.client(asynchronous=True))
            async with collector.episode("e1") as ep:
                with tito.agent("planner"):
                    await client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
                    collector.settings.policies = {"planner": "b"}
                    collector.settings.policy_versions["b"] = "2"
                    await client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
            return [(c.policy, c.policy_version) for c in ep.calls]

    assert asyncio.run(main()) == [("a", None), ("b", "2")]
    assert fake.models_sent() == ["a", "b"]


def test_a_mapping_change_mid_episode_splits_a_merged_sample_at_the_switch() -> None:
    """A merged sample is trained on one policy: the turn sent to the new adapter starts the next
    segment (start_reason "policy_switch", nothing rewritten), every sampled token trained once."""
    fake = MultiModelFake()
    with tito.Collector(policies={"planner": "a"}, assembly="merged") as collector:
        client = collector.wrap(fake.client())
        with collector.episode("e1") as ep, tito.agent("planner"):
            messages: list[dict[str, str]] = [{"role": "user", "content": "hi"}]
            for turn in range(4):
                if turn == 2:
                    collector.settings.policies = {"planner": "b"}
                reply = client.chat.completions.create(model=BASE, messages=messages, max_tokens=8)
                answer = reply.choices[0].message.content or ""
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"go on {turn}"},
                ]
        samples = captured_samples(collector)
    assert fake.models_sent() == ["a", "a", "b", "b"]
    assert [(s.policy, len(s.spans)) for s in samples] == [("a", 2), ("b", 2)]
    first, second = samples
    assert (first.end_reason, second.start_reason) == ("policy_switch", "policy_switch")
    assert second.prev_sample_id == first.sample_id and second.rewrite is None
    assert np.array_equal(second.token_ids[: first.num_tokens], first.token_ids)  # extended
    assert not second.loss_mask[: second.spans[0].start].any()
    calls = {c.call_id: c for c in ep.calls}
    assert sum(s.num_trained for s in samples) == sum(c.sampled_ids.size for c in calls.values())
    (switch,) = ep.divergences
    assert (switch.kind.value, switch.rewrite_point) == ("policy_switch", first.num_tokens)
    assert switch.excerpt == "policy 'a' -> 'b'"


def test_a_failing_hook_sends_the_request_as_written() -> None:
    def hook(agent: str | None, labels: Any) -> str | None:
        raise RuntimeError("boom")

    fake = MultiModelFake()
    with tito.Collector(policies=hook) as collector:
        client = collector.wrap(fake.client())
        with collector.episode("e1", agent="x"):
            reply = client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
        assert reply.model == BASE and collector.stats.uncaptured_requests == 1


@pytest.mark.parametrize(
    "policies",
    [{"planner": ""}, {"planner": 3}, ["planner"], "a"],
)
def test_bad_mappings_are_refused(policies: Any) -> None:
    with pytest.raises(ConfigurationError):
        tito.Collector(policies=policies)
    with pytest.raises(ValueError):
        CollectorSettings().policies = policies


def test_versions_per_policy_fall_back_to_the_global_one() -> None:
    settings = CollectorSettings(policy_version="5")
    settings.policy_versions = {"a": "9", "b": None}
    assert (settings.version_for("a"), settings.version_for("b")) == ("9", None)
    assert (settings.version_for("c"), settings.version_for(None)) == ("5", "5")


def test_int_version_labels_are_stored_as_strings_and_every_sink_writes_them(
    tmp_path: Any,
) -> None:
    """`policy_version=7` (a step counter, numpy's too) is natural; stored as an int it made the
    Parquet sink refuse every sample (a string column). Labels are strings from the start, and
    entries set in place on `settings.policy_versions` are read as strings too."""
    fake = MultiModelFake()
    parquet = tmp_path / "samples.parquet"
    with tito.Collector(
        str(parquet), policies=POLICIES, policy_version=np.int64(7), policy_versions={"b": 3}
    ) as collector:
        assert collector.settings.policy_version == "7"
        assert collector.settings.policy_versions == {"b": "3"}
        _run(fake, collector, ("planner", "coder"))
        collector.settings.policy_versions["a"] = 9  # type: ignore[assignment]
        _run(fake, collector, ("planner",))
    assert collector.stats.delivery is not None and collector.stats.delivery.rejected == 0
    read = list(read_samples(parquet))
    assert sorted(s.spans[0].policy_version for s in read) == ["3", "7", "9"]


@pytest.mark.parametrize("label", [1.5, True, [], {"v": 1}])
def test_labels_that_are_not_strings_or_ints_are_refused(label: Any) -> None:
    with pytest.raises(ConfigurationError):
        tito.Collector(policy_version=label)
    with pytest.raises(ConfigurationError):
        tito.Collector(policy_versions={"a": label})
    with pytest.raises(ValueError):
        CollectorSettings().policy_version = label
    with pytest.raises(ConfigurationError):
        tito.Collector(policy_versions={3: "a"})  # type: ignore[dict-item]


# ---- GRPO groups per (policy, group) ----


def test_groups_are_per_policy() -> None:
    fake = MultiModelFake()
    with tito.Collector(policies=POLICIES) as collector:
        client = collector.wrap(fake.client())
        for i, reward in enumerate((0.0, 1.0)):
            with collector.episode(f"e{i}", group_id="g") as ep:
                for agent in ("planner", "coder", "other"):
                    with tito.agent(agent):
                        client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
                ep.set_reward(reward)
        samples = captured_samples(collector)
    keys = {s.agent: group_key(s) for s in samples}
    assert keys == {"planner": "a:g", "coder": "b:g", "other": "g"}
    adv = group_advantages(samples)
    assert np.allclose(sorted(adv), [-0.7071] * 3 + [0.7071] * 3, atol=1e-3)


def test_merged_samples_carry_the_policy_and_a_users_own_label_is_not_one() -> None:
    fake = MultiModelFake()
    with tito.Collector(policies={"planner": "a"}, assembly="merged") as collector:
        client = collector.wrap(fake.client())
        with collector.episode("e1", group_id="g") as ep:
            for agent in ("planner", "other"):
                with tito.agent(agent), tito.labels(policy="mine"):
                    client.chat.completions.create(model=BASE, messages=MSG, max_tokens=4)
            ep.set_reward(1.0)
        samples = captured_samples(collector)
    assert {s.agent: (s.view, policy_of(s), group_key(s)) for s in samples} == {
        "planner": ("merged", "a", "a:g"),
        "other": ("merged", None, "g"),
    }

"""Token-in sessions without a server: the plan's named steps driven by a toy chat template, each
fallback matched by its `FallbackReason`, and the capture layer's session store (one session per
(episode, agent), shared by every wrapped client, released with the episode)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tito_agents as tito
from tito_agents._capture import SessionStore
from tito_agents._capture.sessions import (
    TAIL_HEAD,
    FallbackReason,
    Plan,
    Session,
    SessionDecision,
    TokenizeResults,
    Turn,
    plan,
    tools_key,
)
from tito_agents.calls import SessionNote
from tito_agents.config import SessionHistoryMode
from tito_agents.episodes import Episode

START, END = 1, 2
ROLES = {"user": 3, "assistant": 4, "system": 5, "tool": 6}
Render = Callable[[dict[str, Any]], list[int] | None]


def text_ids(text: str) -> list[int]:
    return [100 + ord(c) for c in text]


def chatml(*, end: bool = True, drop_past: bool = False) -> Render:
    """A toy template: `START role text END` per message (no END with `end=False`); with
    `drop_past`, an assistant message that is not the last renders as "..." (as templates that
    drop past reasoning re-render history)."""

    def render(payload: dict[str, Any]) -> list[int]:
        messages = payload["messages"]
        out: list[int] = []
        for index, message in enumerate(messages):
            content = message.get("content") or ""
            if drop_past and message["role"] == "assistant" and index != len(messages) - 1:
                content = "..."
            out += [START, ROLES[message["role"]], *text_ids(content)] + ([END] if end else [])
        if payload.get("add_generation_prompt"):
            out += [START, ROLES["assistant"]]
        return out

    return render


def drive(steps: Plan, render: Render) -> SessionDecision:
    """Run a plan as a transport does, answering its `/tokenize` payloads with `render`."""
    try:
        asks = next(steps)
        while True:
            answers: TokenizeResults = [render(ask) for ask in asks]
            asks = steps.send(answers)
    except StopIteration as stop:
        decision: SessionDecision = stop.value
        return decision


USER = [{"role": "user", "content": "hi"}]
ANSWER = {"role": "assistant", "content": "hello"}


def first_turn(session: Session, render: Render, *, ended: bool = True) -> list[dict[str, Any]]:
    """Answer the first request of `session` (the reply "hello", ending on END unless not
    `ended`); returns the messages of the next request."""
    payload = {"messages": USER, "add_generation_prompt": True}
    assert drive(plan(session, payload), render).note is SessionNote.FIRST
    prompt = render(payload)
    assert prompt is not None
    sampled = text_ids("hello") + ([END] if ended else [])
    session.add_turn(
        Turn(
            messages=list(USER),
            tools_key=tools_key(payload),
            prompt_ids=np.asarray(prompt, dtype=np.int32),
            sampled_ids=np.asarray(sampled, dtype=np.int32),
            finish_reason="stop" if ended else "length",
            assistant=ANSWER,
        )
    )
    return [*USER, ANSWER, {"role": "user", "content": "more"}]


def append(session: Session, render: Render, **kwargs: Any) -> SessionDecision:
    messages = first_turn(session, render)
    payload = {"messages": messages, "add_generation_prompt": True}
    return drive(plan(session, payload, **kwargs), render)


def test_an_append_is_the_previous_tokens_and_the_new_messages() -> None:
    render = chatml()
    decision = append(Session(), render)
    assert decision.note is SessionNote.TOKEN_IN and decision.fallback is None
    whole = render({"messages": [*USER, ANSWER, {"role": "user", "content": "more"}]})
    assert whole is not None
    expected = [*whole, START, ROLES["assistant"]]
    assert decision.prompt_ids is not None and decision.prompt_ids.tolist() == expected


def test_a_cut_turn_is_bridged_with_the_end_of_turn_token() -> None:
    render = chatml()
    session = Session()
    messages = first_turn(session, render, ended=False)
    decision = drive(plan(session, {"messages": messages}), render)
    assert decision.note is SessionNote.TOKEN_IN_BRIDGED
    assert decision.prompt_ids is not None and END in decision.prompt_ids.tolist()


def test_a_repeated_request_resamples_the_same_prompt() -> None:
    render = chatml()
    session = Session()
    first_turn(session, render)
    decision = drive(plan(session, {"messages": list(USER)}), render)
    assert decision.note is SessionNote.RESAMPLE
    assert decision.prompt_ids is session.turns[0].prompt_ids


def fallback_of(decision: SessionDecision) -> FallbackReason | None:
    """The cause of a fallback, checked to be the one its text names."""
    assert decision.note is SessionNote.FALLBACK and decision.prompt_ids is None
    assert FallbackReason.of(decision.reason) is decision.fallback
    return decision.fallback


@pytest.mark.parametrize(
    ("payload", "cause"),
    [
        ({"messages": []}, FallbackReason.NO_MESSAGES),
        ({"messages": "hi"}, FallbackReason.NO_MESSAGES),
        (
            {"messages": [*USER, ANSWER, USER[0]], "echo": True},
            FallbackReason.ECHO_OR_CONTINUE,
        ),
        ({"messages": [{"role": "user", "content": "other"}, ANSWER, USER[0]]}, None),
        ({"messages": [*USER, {"role": "assistant", "content": "edited"}, USER[0]]}, None),
    ],
    ids=["empty", "not-a-list", "echo", "rewritten", "edited-answer"],
)
def test_requests_that_cannot_append_fall_back_with_their_cause(
    payload: dict[str, Any], cause: FallbackReason | None
) -> None:
    render = chatml()
    session = Session()
    first_turn(session, render)
    decision = drive(plan(session, payload), render)
    assert fallback_of(decision) is (cause or FallbackReason.NOT_APPEND_ONLY)


def test_a_server_known_to_ignore_token_prompts_is_not_asked_again() -> None:
    render = chatml()
    session = Session()
    messages = first_turn(session, render)
    session.server_ignores_token_in = True
    decision = drive(plan(session, {"messages": messages}), render)
    assert fallback_of(decision) is FallbackReason.SERVER_IGNORES_TOKEN_PROMPT


def test_a_failed_tokenize_falls_back() -> None:
    session = Session(end_of_turn_id=END)
    messages = first_turn(session, chatml())
    decision = drive(plan(session, {"messages": messages}), lambda payload: None)
    assert fallback_of(decision) is FallbackReason.TOKENIZE_FAILED


def test_a_template_without_an_end_of_turn_token_falls_back_for_good() -> None:
    render = chatml(end=False)
    session = Session()
    decision = append(session, render)
    assert fallback_of(decision) is FallbackReason.NO_END_OF_TURN_TOKEN
    assert session.end_of_turn_missing is FallbackReason.NO_END_OF_TURN_TOKEN
    payload = {"messages": [*USER, ANSWER, USER[0]]}
    again = drive(plan(session, payload), render)  # nothing is rendered again
    assert fallback_of(again) is FallbackReason.NO_END_OF_TURN_TOKEN


def test_history_a_template_re_renders_falls_back_or_keeps_the_sampled_tokens() -> None:
    render = chatml(drop_past=True)
    session = Session()
    decision = append(session, render)
    assert fallback_of(decision) is FallbackReason.PREFIX_NOT_PRESERVED
    assert decision.reason is not None and "when appending [user]" in decision.reason
    (checked,) = session.verified.values()  # the verdict is kept for the kind of tail
    assert not checked.preserves_prefix and checked.reason == decision.reason
    sampled = append(Session(), render, history=SessionHistoryMode.SAMPLED)
    assert sampled.note is SessionNote.TOKEN_IN_SAMPLED and sampled.fallback is None


def test_a_known_kind_of_tail_renders_only_the_short_tail() -> None:
    render = chatml()
    verified: dict[tuple[Any, ...], Any] = {}
    append(Session(verified=verified), render)  # the first check of the kind
    asked: list[dict[str, Any]] = []

    def recording(payload: dict[str, Any]) -> list[int] | None:
        asked.append(payload)
        return render(payload)

    session = Session(end_of_turn_id=END, verified=verified)
    messages = first_turn(session, render)
    decision = drive(plan(session, {"messages": messages}), recording)
    assert decision.note is SessionNote.TOKEN_IN
    assert [ask["messages"][0] for ask in asked] == [TAIL_HEAD]


def test_every_reason_is_named_by_its_text() -> None:
    """`of` names the cause of any text a reason writes: no value is a prefix of another."""
    values = [member.value for member in FallbackReason]
    assert len(set(values)) == len(values)
    for value in values:
        assert [v for v in values if v != value and value.startswith(v)] == []
    for member in FallbackReason:
        assert FallbackReason.of(member.explain()) is member
        assert FallbackReason.of(member.explain(" (details)")) is member
        assert member.explain().startswith(str(member))
    assert FallbackReason.of(None) is None and FallbackReason.of("something else") is None


# ---- the capture layer's session store ----


def test_sessions_are_kept_per_episode_and_agent_from_the_episode_settings() -> None:
    collector = tito.Collector(end_of_turn_id=7)
    store = SessionStore()
    ep, other = collector.episode(), collector.episode()
    session = store.session_for(ep, "a")
    assert store.session_for(ep, "a") is session
    assert store.session_for(ep, "b") is not session
    assert store.session_for(other, "a") is not session
    assert session.end_of_turn_id == 7 and session.verified is collector.settings.verified_tails
    assert not hasattr(ep, "_session_state")  # an episode holds no session state


def test_every_wrapped_client_continues_the_same_sessions() -> None:
    """Two clients (two capture cores, even of two collectors) see one session per
    (episode, agent), as when the episode held it."""
    one, two = tito.Collector(), tito.Collector()
    cores = [c._core(frozenset({"vllm"}), True) for c in (one, two, one)]
    assert len({id(core.session_store) for core in cores}) == 1
    ep = one.episode()
    sessions = {id(core.session_store.session_for(ep, None)) for core in cores}
    assert len(sessions) == 1


def test_sessions_are_released_with_their_episodes() -> None:
    collector = tito.Collector()
    store = SessionStore()
    episodes: list[Episode] = [collector.episode() for _ in range(2000)]
    for ep in episodes:
        store.session_for(ep, None)
    assert store.episodes() == 2000
    kept = episodes[0]
    del episodes, ep
    gc.collect()
    assert store.episodes() == 1
    assert store.session_for(kept, None) is store.session_for(kept, None)

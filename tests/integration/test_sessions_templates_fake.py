"""Token-in sessions and the chat template: the end-of-turn token derived from the
server's own template, precise fallbacks for templates that re-render history, and the opt-in
that keeps the model's sampled tokens (`SessionHistoryMode.SAMPLED`). On the fake vLLM, which renders
with the real SmolLM2 tokenizer and the template given here; the real-engine matrix is
tests/e2e/test_templates_real.py."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import numpy as np
import pytest

import tito_agents as tito
from tests.support.sessions_fake import extends, make_client, recording_hook
from tito_agents._capture.sessions import END_OF_TURN_PROBES
from tito_agents.calls import SessionNote
from tito_agents.sessions import FallbackReason
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM
from tito_agents.testing.smollm2 import MODEL_NAME, load_tokenizer

GENERATION = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|im_end|>\n"
    "{% endfor %}" + GENERATION
)
# drops the text of every assistant turn but the last, as templates that drop past reasoning do
DROPS_PAST = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content or '' }}"
    "{% endif %}<|im_end|>\n{% endfor %}" + GENERATION
)
# GLM-style: nothing after a turn's text, the next header follows directly
NO_END = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}{% endfor %}"
    + GENERATION
)
# Llama-3-style marker that the SmolLM2 tokenizer only knows as text
TEXT_MARKER = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}<|eot_id|>"
    "{% endfor %}" + GENERATION
)
# the final assistant turn has no end-of-turn token (earlier ones do)
FINAL_UNTERMINATED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% if not (loop.last and m.role == 'assistant') %}<|im_end|>\n{% endif %}{% endfor %}"
    + GENERATION
)


def fake_with(template: str, answer: str = "Sunny all week.") -> FakeVLLM:
    tokenizer = copy.deepcopy(load_tokenizer())
    tokenizer.chat_template = template
    return FakeVLLM(FakeConfig(responder=lambda view: answer, tokenizer=tokenizer))


def chat(
    fake: FakeVLLM,
    collector: tito.Collector,
    questions: tuple[str, ...] = ("Weather?", "Tomorrow?", "And after?"),
    asks: list[dict[str, Any]] | None = None,
    first_max_tokens: int = 64,
) -> tito.Episode:
    """An append-only chat: user, assistant, user, assistant, ... (`asks` records /tokenize)."""
    hook = recording_hook(asks) if asks is not None else None
    client = make_client(fake, collector, hook)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    with collector.episode() as ep:
        for i, question in enumerate(questions):
            messages.append({"role": "user", "content": question})
            response = client.chat.completions.create(
                model=MODEL_NAME, messages=messages, max_tokens=first_max_tokens if i == 0 else 64
            )
            messages.append({"role": "assistant", "content": response.choices[0].message.content})
    return ep


def test_end_of_turn_is_derived_before_any_turn_ends_on_it() -> None:
    """A first turn cut by max_tokens is bridged with the token the template ends turns with,
    derived from the server's template: the episode never waits to learn it."""
    collector = tito.Collector()
    ep = chat(fake_with(CHATML), collector, first_max_tokens=3)
    cut, bridged, later = ep.calls
    assert cut.finish_reason == "length"
    assert bridged.session == SessionNote.TOKEN_IN_BRIDGED, bridged.session_reason
    eos = load_tokenizer().convert_tokens_to_ids("<|im_end|>")
    head = np.concatenate((cut.prompt_ids, cut.sampled_ids, [eos]))
    assert np.array_equal(bridged.prompt_ids[: head.shape[0]], head)
    assert later.session == SessionNote.TOKEN_IN and extends(bridged, later)


def test_end_of_turn_is_derived_once_per_server_and_model() -> None:
    """Three tiny renders derive the token at the first append; later episodes reuse it."""
    collector = tito.Collector()
    fake = fake_with(CHATML)
    asks: list[dict[str, Any]] = []
    chat(fake, collector, asks=asks)
    probes = [a for a in asks if a["messages"][-1]["content"] in END_OF_TURN_PROBES]
    assert len(probes) == 3 and probes[0]["messages"][0] == {
        "role": "system",
        "content": "Be brief.",
    }
    asks.clear()
    ep = chat(fake, collector, asks=asks)
    assert not [a for a in asks if a["messages"][-1]["content"] in ("1", "2", "1.")]
    assert [c.session for c in ep.calls[1:]] == [SessionNote.TOKEN_IN] * 2


def test_given_end_of_turn_overrides_the_template() -> None:
    """`Collector(end_of_turn_id=...)` is used as given: nothing is derived."""
    collector = tito.Collector(end_of_turn_id=load_tokenizer().convert_tokens_to_ids("<|im_end|>"))
    asks: list[dict[str, Any]] = []
    ep = chat(fake_with(CHATML), collector, asks=asks)
    assert not [a for a in asks if a["messages"][-1]["content"] in ("1", "2", "1.")]
    assert [c.session for c in ep.calls[1:]] == [SessionNote.TOKEN_IN] * 2


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (NO_END, FallbackReason.NO_END_OF_TURN_TOKEN),
        (TEXT_MARKER, FallbackReason.END_OF_TURN_NOT_ONE_TOKEN),
    ],
)
def test_templates_without_a_usable_end_of_turn_token_fall_back_saying_so(
    template: str, reason: FallbackReason
) -> None:
    """A template that ends no turn with a token, or whose marker is text to the served
    tokenizer, cannot be cut exactly: every append falls back with that reason, and stays exact."""
    collector = tito.Collector()
    ep = chat(fake_with(template), collector)
    for call in ep.calls[1:]:
        assert call.session == SessionNote.FALLBACK
        assert FallbackReason.of(call.session_reason) is reason
    assert all(c.status is tito.CallStatus.COMPLETE for c in ep.calls)


def test_a_cut_before_the_previous_turn_is_refused() -> None:
    """A template that leaves the final assistant turn unterminated has one end-of-turn token
    fewer than the conversation: cutting after its last one would re-render the previous turn's
    text into the prompt, so the call falls back (the token given, so nothing is derived)."""
    eot = load_tokenizer().convert_tokens_to_ids("<|im_end|>")
    collector = tito.Collector(end_of_turn_id=eot)
    ep = chat(fake_with(FINAL_UNTERMINATED), collector)
    for call in ep.calls[1:]:
        assert call.session == SessionNote.FALLBACK
        assert FallbackReason.of(call.session_reason) is FallbackReason.TURN_COUNT_MISMATCH


def test_template_that_re_renders_history_falls_back_with_where_and_the_fix() -> None:
    """The reason names the appended roles, that the previous assistant turn is what changes,
    and the fixes; the verdict is kept per kind of tail, so later appends do not render again."""
    collector = tito.Collector()
    asks: list[dict[str, Any]] = []
    ep = chat(fake_with(DROPS_PAST), collector, asks=asks, questions=("A?", "B?", "C?", "D?"))
    reasons = [c.session_reason or "" for c in ep.calls[1:]]
    assert all(c.session == SessionNote.FALLBACK for c in ep.calls[1:])
    assert FallbackReason.of(reasons[0]) is FallbackReason.PREFIX_NOT_PRESERVED
    assert "when appending [user]" in reasons[0]
    assert "previous assistant turn differently" in reasons[0]
    assert "qwen3_training.jinja" in reasons[0] and "session_history='sampled'" in reasons[0]
    assert len(set(reasons)) == 1
    assert len(asks) == 6  # derivation (3) + the first check (3); later appends render nothing


def test_sampled_history_keeps_the_sampled_tokens_and_renders_only_the_new_messages() -> None:
    """Opt-in: where the template would re-render history, the model keeps its own tokens; each
    prompt is the previous prompt + sampled ids + the template's rendering of the new messages."""
    collector = tito.Collector(session_history="sampled", assembly="merged")
    assert collector.settings.session_history is tito.SessionHistoryMode.SAMPLED
    fake = fake_with(DROPS_PAST)
    ep = chat(fake, collector, questions=("A?", "B?", "C?", "D?"))
    tok = load_tokenizer()
    for prev, call in itertools.pairwise(ep.calls):
        assert call.session == SessionNote.TOKEN_IN_SAMPLED, call.session_reason
        assert "session_history='sampled'" in (call.session_reason or "")
        assert extends(prev, call)
        head = prev.prompt_ids.shape[0] + prev.sampled_ids.shape[0]
        delta = tok.decode(call.prompt_ids[head:].tolist())
        question = call.messages[-1]["content"] if call.messages else None
        assert delta == f"\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    assert len(captured_samples(collector)) == 1


def test_sampled_history_changes_nothing_where_the_template_preserves_the_prefix() -> None:
    """With a prefix-preserving template the opt-in is plain token-in."""
    collector = tito.Collector(session_history="sampled")
    ep = chat(fake_with(CHATML), collector)
    assert [c.session for c in ep.calls[1:]] == [SessionNote.TOKEN_IN] * 2


def test_a_request_template_is_rendered_by_the_session_too() -> None:
    """A request that carries its own `chat_template` is rendered with it by every /tokenize the
    session sends (the server's default template would give other deltas)."""
    collector = tito.Collector()
    asks: list[dict[str, Any]] = []
    client = make_client(fake_with(CHATML), collector, recording_hook(asks))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather?"}]
    with collector.episode() as ep:
        for _ in range(2):
            response = client.chat.completions.create(
                model=MODEL_NAME, messages=messages, extra_body={"chat_template": CHATML}
            )
            messages += [
                {"role": "assistant", "content": response.choices[0].message.content},
                {"role": "user", "content": "And then?"},
            ]
    assert ep.calls[1].session == SessionNote.TOKEN_IN
    assert asks and all(ask.get("chat_template") == CHATML for ask in asks)

"""`tito-agents drift`: what re-tokenizing text (instead of keeping sampled ids) would change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.call_factory import make_call
from tests.support.cli_samples import _sample, run_cli, write_samples
from tito_agents.samples import Sample
from tito_agents.testing.smollm2 import TOOLS_TEMPLATE_PATH, load_tokenizer, tokenizer_dir

MESSAGES = [
    {"role": "system", "content": "You are a helpful AI assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
]


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer()


def _enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _prompt(tok: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return _enc(tok, text)


def _one_call(tok: Any, name: str, prompt: list[int], sampled: list[int], **meta: Any) -> Sample:
    sample = _sample(
        name,
        f"ep-{name}",
        "a",
        [*prompt, *sampled],
        [(f"{name}/0", 0, len(prompt), len(prompt) + len(sampled), "stop", None)],
        reward=1.0,
        start_reason="call",
        end_reason="stop",
    )
    sample.metadata.update(meta)
    return sample


def _drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], samples: list[Sample], *extra: str
) -> dict[str, Any]:
    path = write_samples(tmp_path / "s.jsonl", samples)
    code, out, err = run_cli(
        [
            "drift",
            path,
            "--tokenizer",
            tokenizer_dir(),
            "--chat-template",
            TOOLS_TEMPLATE_PATH,
            "--json",
            *extra,
        ],
        capsys,
    )
    assert code == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_canonical_ids_do_not_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """Ids that are the tokenizer's own encoding of their text round-trip: zero drift everywhere."""
    sample = _one_call(
        tok, "ok", _prompt(tok, MESSAGES), _enc(tok, "It is sunny in Paris.<|im_end|>")
    )
    data = _drift(tmp_path, capsys, [sample])
    assert data["calls"]["scanned"] == 1 and data["calls"]["drifted"] == 0
    assert data["sequences"]["drifted"] == 0 and data["samples"]["with_drifted_call"] == 0
    assert data["calls"]["tokens"] == sample.num_trained


def test_non_canonical_split_is_retokenized_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """A word the model sampled in two pieces re-encodes as one token: a `retokenized` call whose
    affected tokens run from the split to the end of the call."""
    head, tail = _enc(tok, "It is sunny in"), _enc(tok, "<|im_end|>")
    split = _enc(tok, " Par") + _enc(tok, "is")
    assert split != _enc(tok, " Paris"), "the test needs a non-canonical split"
    sampled = [*head, *split, *tail]
    good = _one_call(tok, "good", _prompt(tok, MESSAGES), _enc(tok, "Fine.<|im_end|>"))
    bad = _one_call(tok, "bad", _prompt(tok, MESSAGES), sampled)
    data = _drift(tmp_path, capsys, [good, bad])
    calls = data["calls"]
    assert calls["scanned"] == 2 and calls["drifted"] == 1
    assert calls["by_kind"]["retokenized"] == {
        "count": 1,
        "tokens_affected": len(sampled) - len(head),
    }
    assert data["samples"]["with_drifted_call"] == 1 and data["sequences"]["drifted"] == 1
    example = data["examples"][0]
    assert example["sample_id"] == "bad" and example["position"] == len(head)
    assert example["captured"][2:4] == [" Par", "is"]


def test_a_cut_multibyte_character_is_lossy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """A completion cut inside a multi-byte character decodes to a replacement character: its text
    does not even round-trip (`lossy_text`)."""
    emoji = _enc(tok, "🙂")
    assert len(emoji) > 1, "the test needs a character split over several byte tokens"
    sampled = [*_enc(tok, "Sure "), emoji[0]]
    data = _drift(tmp_path, capsys, [_one_call(tok, "cut", _prompt(tok, MESSAGES), sampled)])
    assert data["calls"]["by_kind"]["lossy_text"]["count"] == 1


def test_template_rerendering_of_captured_messages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """Where samples carry the messages each call was sent with, the prompt is re-rendered: equal
    prompts do not drift, the same text in other ids is `retokenized`, other text is `content`."""
    prompt = _prompt(tok, MESSAGES)
    answer = _enc(tok, "Sunny.<|im_end|>")
    same = _one_call(tok, "same", prompt, answer, messages=MESSAGES)
    text = tok.decode(prompt, skip_special_tokens=False)
    where = text.index("Paris")
    respelled = (
        _enc(tok, text[:where]) + _enc(tok, "Par") + _enc(tok, "is") + _enc(tok, text[where + 5 :])
    )
    assert tok.decode(respelled, skip_special_tokens=False) == text and respelled != prompt
    retokenized = _one_call(tok, "retok", respelled, answer, messages=MESSAGES)
    edited = [dict(m) for m in MESSAGES]
    edited[1]["content"] = "What is the weather in Rome?"
    other = _one_call(tok, "other", prompt, answer, call_messages={"other/0": {"messages": edited}})
    data = _drift(tmp_path, capsys, [same, retokenized, other])
    rerender = data["template_rerender"]
    assert rerender["available"] and rerender["scanned"] == 3 and rerender["drifted"] == 2
    assert set(rerender["by_kind"]) == {"retokenized", "content"}


def test_without_messages_rerendering_is_reported_as_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """Samples without captured messages: the table says template re-rendering was not measured."""
    path = write_samples(
        tmp_path / "s.jsonl",
        [_one_call(tok, "x", _prompt(tok, MESSAGES), _enc(tok, "Hi.<|im_end|>"))],
    )
    code, out, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir()], capsys)
    assert code == 0
    assert "calls" in out and "samples (whole sequence)" in out
    assert "template re-rendering: not measured" in out


def test_fail_on_drift_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """--fail-on-drift exits 1 when a call drifted (for CI gates), 0 otherwise."""
    sampled = [*_enc(tok, " Par"), *_enc(tok, "is")]
    path = write_samples(tmp_path / "s.jsonl", [_one_call(tok, "d", [1, 2], sampled)])
    code, _, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir(), "--fail-on-drift"], capsys)
    assert code == 1
    code, _, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir()], capsys)
    assert code == 0


def test_many_samples_are_batched_consistently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """Across tokenizer batches every call is counted once and drift is attributed to the right ones."""
    split = [*_enc(tok, " Par"), *_enc(tok, "is")]
    samples = [
        _one_call(tok, f"s{i}", [1, 2, 3], split if i % 7 == 0 else _enc(tok, " Paris"))
        for i in range(600)
    ]
    data = _drift(tmp_path, capsys, samples, "--calls-only")
    assert data["calls"]["scanned"] == 600
    assert data["calls"]["drifted"] == len([i for i in range(600) if i % 7 == 0])
    assert data["sequences"]["scanned"] == 600 and data["sequences"]["drifted"] == 0
    assert np.isclose(data["calls"]["tokens"], sum(s.num_trained for s in samples))


def test_ids_beyond_the_vocabulary_mean_the_wrong_tokenizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """Ids the tokenizer does not have: one line saying the tokenizer is probably not the model's."""
    path = write_samples(tmp_path / "s.jsonl", [_one_call(tok, "big", [1, 2], [10**7])])
    code, out, err = run_cli(["drift", path, "--tokenizer", tokenizer_dir()], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "sample big holds id 10000000" in err and "--tokenizer" in err


@pytest.mark.parametrize(
    ("content", "problem"), [("", "empty"), ("{% if %}broken", "does not compile")]
)
def test_chat_template_that_is_empty_or_broken_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any, content: str, problem: str
) -> None:
    """`--chat-template` with an empty file or a syntax error exits 2 naming the template, never
    a report measured against nothing."""
    path = write_samples(
        tmp_path / "s.jsonl",
        [
            _one_call(
                tok, "x", _prompt(tok, MESSAGES), _enc(tok, "Hi.<|im_end|>"), messages=MESSAGES
            )
        ],
    )
    template = tmp_path / "t.jinja"
    template.write_text(content)
    code, out, err = run_cli(
        ["drift", path, "--tokenizer", tokenizer_dir(), "--chat-template", template], capsys
    )
    assert code == 2 and out == ""
    assert problem in err and str(template) in err


def test_template_check_runs_only_against_a_named_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """The samples do not say which template the server used, so without --chat-template the
    re-render check is not run (and says how to run it); `--chat-template tokenizer` names the
    tokenizer folder's own, and the report names the template it used."""
    same = _one_call(
        tok, "same", _prompt(tok, MESSAGES), _enc(tok, "Hi.<|im_end|>"), messages=MESSAGES
    )
    path = write_samples(tmp_path / "s.jsonl", [same])
    code, out, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir(), "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["chat_template"] is None
    assert not data["template_rerender"]["available"]
    _, text, _ = run_cli(["drift", path, "--tokenizer", tokenizer_dir()], capsys)
    assert "not measured (give --chat-template" in text
    code, out, _ = run_cli(
        ["drift", path, "--tokenizer", tokenizer_dir(), "--chat-template", "tokenizer", "--json"],
        capsys,
    )
    data = json.loads(out)
    assert code == 0 and data["chat_template"].endswith("(its own template)")
    assert data["template_rerender"]["scanned"] == 1
    assert data["template_rerender"]["drifted"] == 0


def _chat_call(tok: Any, cid: str, messages: list[dict[str, Any]], answer: str) -> Any:
    prompt, sampled = _prompt(tok, messages), _enc(tok, answer)
    return make_call(cid, prompt, sampled, request_id=cid, agent="a", messages=messages)


def test_attached_call_messages_are_measured_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tok: Any
) -> None:
    """Samples assembled with `assembly="both"` and their calls' messages attached
    (`attach_call_messages`, the opt-in writer) are re-rendered by drift with the server's template:
    every call is measured once (from the merged sample: the per-call samples hold the same calls),
    none drifts; against another template, all drift."""
    from tito_agents.assembly import AssemblyMode, AssemblyOptions, EpisodeContext, assemble
    from tito_agents.assembly.call_messages import attach_call_messages

    first = _chat_call(tok, "c1", MESSAGES, "It is sunny.<|im_end|>")
    second_messages = [
        *MESSAGES,
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    second = _chat_call(tok, "c2", second_messages, "Rain.<|im_end|>")
    samples, _ = assemble(
        [first, second], EpisodeContext("ep"), AssemblyOptions(mode=AssemblyMode.BOTH)
    )
    assert attach_call_messages(samples, [first, second]) == len(samples) == 3
    merged = samples[-1]
    assert set(merged.metadata["call_messages"]) == {"c1", "c2"}
    data = _drift(tmp_path, capsys, samples)
    rerender = data["template_rerender"]
    assert rerender["available"] and rerender["scanned"] == 2  # the 2 spans of the merged sample
    assert rerender["drifted"] == 0
    assert data["calls"]["scanned"] == 2 and data["samples"]["scanned"] == 1
    assert data["samples"]["other_view_left_out"] == 2
    other = tmp_path / "other.jinja"
    other.write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    path = write_samples(tmp_path / "s2.jsonl", samples)
    code, out, _ = run_cli(
        ["drift", path, "--tokenizer", tokenizer_dir(), "--chat-template", other, "--json"], capsys
    )
    assert code == 0 and json.loads(out)["template_rerender"]["drifted"] == 2


def test_empty_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty samples file is not a report of zeros: exit 2 with one line saying it is empty."""
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    code, out, err = run_cli(["drift", path, "--tokenizer", tokenizer_dir()], capsys)
    assert code == 2 and out == ""
    assert "holds no samples" in err and str(path) in err

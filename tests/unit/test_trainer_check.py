"""The trainer check on a tiny random Llama: every converter layout, fed the way its trainer feeds
it, gives back each sample's own per-sequence logprobs on exactly its trained tokens; a sample whose
logprobs sit one position off is caught; the GRPO step moves the policy the advantage's way; the
saved weights load back; the text pipeline counts a non-canonical spelling as differing tokens;
`tito-agents compare` draws the page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.call_factory import make_call

torch = pytest.importorskip("torch", reason="the trainer check needs torch")
transformers = pytest.importorskip("transformers", reason="the trainer check needs transformers")

from tito_agents.calls import Call  # noqa: E402
from tito_agents.cli.main import main as cli_main  # noqa: E402
from tito_agents.samples import CallSpan, Sample  # noqa: E402
from tito_agents.trainer_check import (  # noqa: E402
    LAYOUTS,
    RatioStats,
    grpo_step,
    load_policy,
    masked_rollout,
    next_token_logprobs,
    save_policy,
    score_layout,
)
from tito_agents.trainer_check.plot import render_html  # noqa: E402

VOCAB = 96


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = transformers.LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(str(folder))
    return folder


def _own_logprobs(model: Any, ids: np.ndarray) -> np.ndarray:
    """Each token's logprob given its prefix, the sequence alone (no padding, no packing)."""
    lp = next_token_logprobs(model, ids[None])[0]
    out = np.zeros(ids.shape[0], dtype=np.float32)
    out[1:] = lp[:-1]
    return out


def _sample(index: int, model: Any, parts: list[tuple[int, bool]], reward: float) -> Sample:
    """Context and sampled parts in order (length, sampled?); logprobs from the model itself."""
    rng = np.random.default_rng(index)
    ids = rng.integers(3, VOCAB, size=sum(n for n, _ in parts)).astype(np.int32)
    mask = np.concatenate([np.full(n, int(s), dtype=np.uint8) for n, s in parts])
    spans, pos, ctx = [], 0, 0
    for k, (n, sampled) in enumerate(parts):
        if sampled:
            spans.append(CallSpan(f"s{index}-c{k}/0", ctx, pos, pos + n, "stop"))
            ctx = pos + n
        pos += n
    logprobs = np.where(mask == 1, _own_logprobs(model, ids), 0.0).astype(np.float32)
    return Sample(
        sample_id=f"s{index}",
        episode_id=f"e{index}",
        agent=None,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        reward=reward,
        call_ids=[s.call_id for s in spans],
        spans=spans,
        group_id="g",
    )


@pytest.fixture(scope="module")
def batch(tiny_dir: Path) -> list[Sample]:
    model = load_policy(tiny_dir, "fp32")
    shapes = [
        [(7, False), (5, True), (4, False), (6, True)],
        [(3, False), (9, True)],
        [(12, False), (4, True), (2, False), (3, True), (5, False), (2, True)],
    ]
    return [_sample(i, model, parts, float(i % 2)) for i, parts in enumerate(shapes)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_gives_back_each_sequences_own_logprobs(
    layout: str, tiny_dir: Path, batch: list[Sample]
) -> None:
    model = load_policy(tiny_dir, "fp32")
    scores = score_layout(layout, model, batch, pad_id=0)
    for sample, score in zip(batch, scores, strict=True):
        trained = np.flatnonzero(sample.loss_mask)
        np.testing.assert_array_equal(score.ids, sample.token_ids[trained])
        assert sample.logprobs is not None
        np.testing.assert_allclose(score.rollout, sample.logprobs[trained], atol=0)
        stats = RatioStats.of(score.trainer - score.rollout)
        assert stats.tokens == trained.shape[0]
        assert stats.max_abs < 1e-4, (layout, stats)


@pytest.mark.parametrize("layout", ["pad_left", "pack", "trl"])
def test_logprobs_one_position_off_are_caught(
    layout: str, tiny_dir: Path, batch: list[Sample]
) -> None:
    model = load_policy(tiny_dir, "fp32")
    shifted = []
    for sample in batch:
        assert sample.logprobs is not None
        lp = np.where(sample.loss_mask == 1, np.roll(_own_logprobs(model, sample.token_ids), 1), 0)
        shifted.append(
            Sample(**{**{f: getattr(sample, f) for f in sample.__slots__}, "logprobs": lp})  # type: ignore[attr-defined]
        )
    scores = score_layout(layout, model, shifted, pad_id=0)
    ratios = np.concatenate([s.trainer - s.rollout for s in scores])
    assert RatioStats.of(ratios).mean_abs > 0.1


def test_ratio_stats() -> None:
    stats = RatioStats.of(np.array([0.0, 0.1, -0.3, np.log(1.25)]))
    assert stats.tokens == 4
    assert stats.max_abs == pytest.approx(0.3)
    assert stats.outside_clip == 2  # exp(-0.3) = 0.74 and 1.25 lie outside [0.8, 1.2]
    assert "2 of 4 tokens" in stats.line()
    assert RatioStats.from_dict(stats.to_dict()) == stats
    assert RatioStats.of(np.zeros(0)).tokens == 0


def test_grpo_step_moves_the_policy_the_advantages_way(
    tiny_dir: Path, batch: list[Sample], tmp_path: Path
) -> None:
    model = load_policy(tiny_dir, "fp32")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    pair = batch[:2]  # rewards 0 and 1, one group
    before = [_own_logprobs(model, s.token_ids)[s.loss_mask == 1].sum() for s in pair]
    result = grpo_step(model, optimizer, pair, [masked_rollout(s, frozenset()) for s in pair])
    after = [_own_logprobs(model, s.token_ids)[s.loss_mask == 1].sum() for s in pair]
    assert result.tokens == sum(s.num_trained for s in pair)
    assert result.advantages[0] < 0 < result.advantages[1]
    assert after[0] < before[0] and after[1] > before[1]
    assert result.changed_bf16 > 0

    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=__import__("tokenizers").Tokenizer(
            __import__("tokenizers").models.WordLevel({"a": 0}, unk_token="a")
        )
    )
    out = save_policy(model, tokenizer, tiny_dir, tmp_path / "policy-1")
    again = load_policy(out, "fp32")
    for (name, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(p.detach().to(torch.bfloat16).float(), q.detach()), name


def test_masked_tokens_take_no_rollout_logprob(batch: list[Sample]) -> None:
    sample = batch[0]
    masked = masked_rollout(sample, frozenset({sample.spans[1].call_id}))
    span = sample.spans[1]
    assert masked[span.start : span.end].all()
    assert masked.sum() == span.end - span.start


def _call(call_id: str, messages: list[dict[str, Any]], sampled: list[int]) -> Call:
    return make_call(call_id, [0], sampled, logprob=-0.5, messages=messages)


def test_text_pipeline_counts_a_non_canonical_spelling() -> None:
    smollm2 = pytest.importorskip("tito_agents.testing.smollm2")
    from tito_agents.testing.fake_vllm._codec import TokenCodec
    from tito_agents.trainer_check.text_pipeline import rebuild

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2.tokenizer_dir()))
    tokenizer.chat_template = smollm2.TOOLS_TEMPLATE_PATH.read_text(encoding="utf-8")
    codec = TokenCodec(tokenizer)
    first = [{"role": "user", "content": "Weather in Paris?"}]
    canonical = codec.encode("It is sunny in Paris.", add_special_tokens=False) + [2]
    word = codec.encode(" weather", add_special_tokens=False)
    assert len(word) == 1
    head = codec.encode("It is", add_special_tokens=False)
    assert codec.encode("It is weather", add_special_tokens=False) == head + word
    split = (
        head
        + codec.encode(" wea", add_special_tokens=False)
        + codec.encode("ther", add_special_tokens=False)
        + [2]
    )
    second = [*first, {"role": "assistant", "content": "x"}, {"role": "user", "content": "More?"}]
    calls = {"a/0": _call("a/0", first, canonical), "b/0": _call("b/0", second, split)}
    sample = Sample(
        sample_id="s",
        episode_id="e",
        agent=None,
        token_ids=np.zeros(1, dtype=np.int32),
        loss_mask=np.zeros(1, dtype=np.uint8),
        logprobs=None,
        reward=None,
        call_ids=["a/0", "b/0"],
        spans=[CallSpan("a/0", 0, 0, 0), CallSpan("b/0", 0, 0, 0)],
    )
    row = rebuild(sample, calls, codec, eos_ids=frozenset({2}), end_of_turn="<|im_end|>")
    assert row.calls == 2 and row.calls_drifted == 1
    pieces = len(split) - len(head) - 1  # " wea" + "ther", 2 or more sampled tokens
    assert pieces >= 2
    assert row.trained.shape[0] == len(canonical) + len(head) + 1 + 1  # " weather" is one token
    assert int((~row.matches).sum()) == 1
    merged = int(np.flatnonzero(~row.matches)[0])
    assert row.rollout[merged] == pytest.approx(-0.5 * pieces)  # the pieces' joint logprob
    text = tokenizer.decode(row.input_ids[row.trained].tolist())
    assert text == "It is sunny in Paris.<|im_end|>It is weather<|im_end|>"


def test_cli_compare_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stats = RatioStats.of(np.array([0.01, -0.02])).to_dict()
    figures = {"free": stats, "constrained": stats, "trained_tokens": 2, "differing": 0}
    data = {
        "model": "m",
        "samples": 1,
        "calls": 1,
        "tito": {"fp32": {"pack": figures}},
        "text": {"fp32": figures | {"differing": 1}},
        "log_ratios": {"tito": [0.01, -0.02], "text": [0.5, -2.0]},
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    assert cli_main(["compare", str(path)]) == 0
    assert "tito fp32 pack" in capsys.readouterr().out
    page = tmp_path / "c.html"
    assert cli_main(["compare", str(path), "--html", str(page)]) == 0
    html = page.read_text()
    assert html.count("<rect") >= 4 and "text pipeline fp32" in html
    assert html == render_html(data)
    path.write_text("{}")
    assert cli_main(["compare", str(path)]) == 2

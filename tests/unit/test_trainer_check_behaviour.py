"""The trainer check's behaviour figures on a tiny random Llama: samples whose rollout logprobs are
the processed ones of a tempered, truncated distribution (what vLLM returns under
`--logprobs-mode processed_logprobs`) come back exact once corrected and far off naively; plain
samples are exact both ways; `compare` reports the figures only for samples that need them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer check needs torch")
transformers = pytest.importorskip("transformers", reason="the trainer check needs transformers")

from tito_agents.convert import behaviour_logprobs  # noqa: E402
from tito_agents.samples import CallSpan, Sample  # noqa: E402
from tito_agents.sampling import PROCESSED_LOGPROBS, SamplingParams  # noqa: E402
from tito_agents.trainer_check import (  # noqa: E402
    behaviour_figures,
    compare,
    grpo_step,
    load_policy,
    side_by_side,
)
from tito_agents.trainer_check.model import logits_of  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    folder = tmp_path_factory.mktemp("tiny-llama-behaviour")
    transformers.LlamaForCausalLM(config).save_pretrained(str(folder))
    return folder


def _sample(model: object, index: int, params: SamplingParams) -> Sample:
    """A prompt of 6 ids, then 24 ids sampled from the behaviour distribution, with its logprobs."""
    rng = np.random.default_rng(index)
    ids = list(rng.integers(0, VOCAB, size=6))
    for _ in range(24):  # draw each token from what the engine would sample from
        row = logits_of(model, np.asarray([ids]))[0, -1].double().numpy()
        probs = np.exp(
            [behaviour_logprobs(row[None], [v], params).logprobs[0] for v in range(VOCAB)]
        )
        ids.append(int(rng.choice(VOCAB, p=probs / probs.sum())))
    token_ids = np.asarray(ids, dtype=np.int32)
    rows = logits_of(model, token_ids[None].astype(np.int64))[0, 5:-1].numpy()
    logprobs = np.zeros(30, dtype=np.float32)
    logprobs[6:] = behaviour_logprobs(rows, token_ids[6:], params).logprobs
    span = CallSpan("c/0", 0, 6, 30, sampling=params, logprobs_mode=PROCESSED_LOGPROBS)
    return Sample(
        sample_id=f"s{index}",
        episode_id=f"e{index}",
        agent=None,
        token_ids=token_ids,
        loss_mask=np.r_[np.zeros(6), np.ones(24)].astype(np.uint8),
        logprobs=logprobs,
        reward=float(index % 2),
        call_ids=["c/0"],
        spans=[span],
        group_id="g",
    )


def test_processed_logprobs_are_exact_once_corrected(tiny_dir: Path) -> None:
    model = load_policy(tiny_dir, "fp32")
    params = SamplingParams(temperature=0.7, top_p=0.8, top_k=20)
    samples = [_sample(model, i, params) for i in range(2)]
    figures = behaviour_figures(model, samples)
    assert figures.corrected.tokens == 48 and figures.outside == 0
    assert figures.corrected.max_abs < 1e-4
    assert figures.naive.mean_abs > 0.05
    assert (figures.truncated_spans, figures.logprobs_modes) == (2, {PROCESSED_LOGPROBS: 2})
    plain = behaviour_figures(model, [_sample(model, 5, SamplingParams())])
    assert plain.naive.max_abs < 1e-4 and plain.corrected.max_abs < 1e-4


def test_compare_reports_behaviour_figures_only_when_needed(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoTokenizer:  # the tiny model has none; only its pad id is read without a text pipeline
        pad_token_id = 0

    monkeypatch.setattr(side_by_side, "load_tokenizer", lambda _path: NoTokenizer())
    model = load_policy(tiny_dir, "fp32")
    tempered = [_sample(model, 3, SamplingParams(temperature=0.5))]
    result = compare(tempered, {}, tiny_dir, layouts=("pack",), text_dtypes=())
    assert result.behaviour["fp32"].corrected.max_abs < 1e-4
    assert "behaviour" in result.to_dict()
    plain = [_sample(model, 4, SamplingParams())]
    assert compare(plain, {}, tiny_dir, layouts=("pack",), text_dtypes=()).behaviour == {}


def test_the_rl_step_divides_by_behaviour_logprobs_when_they_are_processed(tiny_dir: Path) -> None:
    params = SamplingParams(temperature=0.6, top_k=10)
    model = load_policy(tiny_dir, "fp32")
    samples = [_sample(model, i, params) for i in range(2)]
    masked = [np.zeros(s.num_tokens, dtype=bool) for s in samples]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    exact = grpo_step(model, optimizer, samples, masked)
    assert (exact.tokens, exact.clipped) == (48, 0)  # on-policy: every ratio is 1
    for sample in samples:  # the same logprobs, but nobody says they are the processed ones
        sample.spans[0].logprobs_mode = None
    naive = grpo_step(model, optimizer, samples, masked)
    assert naive.clipped > 10

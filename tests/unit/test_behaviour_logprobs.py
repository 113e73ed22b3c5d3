"""Behaviour logprobs (`tito_agents.convert.behaviour`) against what actually samples.

The distribution is rebuilt here independently and plainly (a loop over the tokens sorted by
probability), sampled 200k times with fixed seeds, and compared with `exp(behaviour logprobs)`;
where the vLLM venv exists, vLLM's own v1 sampler draws the tokens and returns its processed
logprobs (tests/support/vllm_sampler_probe.py, run by that venv's python). Seeded throughout: the
chi-square bounds are checked on fixed draws, so nothing here can flake.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tito_agents.convert.behaviour import (
    SamplingParams,
    TokenSampling,
    behaviour_logprobs,
    behaviour_logprobs_torch,
    needs_behaviour_logprobs,
)
from tito_agents.sinks.harness import synthetic_sample

torch = pytest.importorskip("torch")

PROBE = Path(__file__).resolve().parents[1] / "support" / "vllm_sampler_probe.py"
CACHE = Path(os.environ.get("TITO_CACHE_DIR") or "~/.cache/tito-agents").expanduser()
VLLM_PYTHON = CACHE / "vllm-venv" / "bin" / "python"

CONFIGS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(top_p=0.8),
    SamplingParams(top_k=5),
    SamplingParams(min_p=0.1),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, top_k=8, top_p=0.85, min_p=0.02),
]


def reference(row: npt.NDArray[np.float64], params: SamplingParams) -> npt.NDArray[np.float64]:
    """The distribution vLLM samples from, built without the library's vectorised code."""
    if params.temperature < 1e-5:
        out = np.zeros(row.size)
        out[int(np.argmax(row))] = 1.0
        return out
    z = row / max(params.temperature, 0.01)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    keep = np.ones(row.size, dtype=bool)
    if params.min_p > 0:
        keep &= probs >= params.min_p * probs.max()
    if 0 < params.top_k < row.size:
        values = sorted(np.where(keep, z, -np.inf), reverse=True)
        keep &= z >= values[params.top_k - 1]
    if params.top_p < 1:
        kept = np.where(keep, probs, 0.0) / np.where(keep, probs, 0.0).sum()
        mass_above = 0.0
        for token in sorted(range(row.size), key=lambda i: (-kept[i], -i)):
            if mass_above >= params.top_p:
                keep[token] = False
            mass_above += kept[token]
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def all_tokens(row: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
    """`row` repeated once per token id, with every id as the sampled token."""
    return np.repeat(row[None], row.size, axis=0), np.arange(row.size)


def assert_frequencies(counts: npt.NDArray[np.int64], probs: npt.NDArray[Any]) -> None:
    """Pearson chi-square on the support, far from any plausible value (fixed draws: exact), and
    no draw at all outside the support."""
    n = counts.sum()
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = n * probs[support]
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    dof = max(int(support.sum()) - 1, 1)
    assert chi2 < dof + 8 * math.sqrt(2 * dof) + 8, (chi2, dof)


@pytest.mark.parametrize("params", CONFIGS, ids=str)
def test_matches_the_independent_reference(params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        row = rng.normal(0, 2, size=40)
        got = behaviour_logprobs(*all_tokens(row), params)
        want = reference(row, params)
        np.testing.assert_allclose(np.exp(got.logprobs), want, rtol=1e-10, atol=1e-14)
        assert np.array_equal(got.outside, want == 0)
        assert got.n_outside == int((want == 0).sum())


@pytest.mark.parametrize("params", CONFIGS, ids=str)
def test_brute_force_sampling_frequencies(params: SamplingParams) -> None:
    rng = np.random.default_rng(11)
    row = rng.normal(0, 1.5, size=16)
    draws = rng.choice(row.size, size=200_000, p=reference(row, params))
    counts = np.bincount(draws, minlength=row.size)
    assert_frequencies(counts, np.exp(behaviour_logprobs(*all_tokens(row), params).logprobs))


@pytest.mark.e2e  # the e2e tier runs after `make vllm-prepare`, so the vLLM venv exists there
@pytest.mark.timeout(300)
def test_vllm_sampler_draws_and_processed_logprobs() -> None:
    """vLLM's own sampler (CPU build, processed_logprobs): its draw frequencies and the logprobs it
    returns are those of `behaviour_logprobs`, per row parameters in one batch, ties included."""
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM venv at {VLLM_PYTHON} (make vllm-prepare builds it)")
    rng = np.random.default_rng(3)
    rows: list[tuple[list[float], SamplingParams]] = [
        (rng.normal(0, 1.5, size=12).tolist(), params) for params in CONFIGS
    ]
    rows.append(([3.0, 1.0, 1.0, 1.0, 0.0, -1.0], SamplingParams(top_k=2)))  # ties kept past k
    rows.append((np.log([0.5, 0.25, 0.15, 0.1]).tolist(), SamplingParams(top_p=0.65)))  # crossing
    rows.append(([2.0, 1.0, 1.0, 0.0], SamplingParams(top_p=0.6)))  # tie across the boundary
    rows.append(([0.5, 2.0, -1.0, 1.0], SamplingParams(temperature=0.0)))  # greedy row in the batch
    width = max(len(r) for r, _ in rows)
    padded = [r + [-1e4] * (width - len(r)) for r, _ in rows]
    spec = {
        "logits": padded,
        **{name: [getattr(p, name) for _, p in rows] for name in SamplingParams().as_dict()},
        "repeats": 40_000,
        "seed": 0,
    }
    done = subprocess.run(
        [str(VLLM_PYTHON), str(PROBE)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    for (row, params), logits, counts, processed in zip(
        rows, padded, out["counts"], out["processed"], strict=True
    ):
        ours = behaviour_logprobs(*all_tokens(np.array(logits, dtype=np.float32)), params)
        assert_frequencies(np.array(counts), np.exp(ours.logprobs.astype(np.float64)))
        if params.is_greedy:  # vLLM returns log_softmax(logits) there, not the point mass
            continue
        vllm = np.array([-np.inf if v is None else v for v in processed])
        assert np.array_equal(np.isinf(vllm), ours.outside), (row, params)
        np.testing.assert_allclose(vllm[~ours.outside], ours.logprobs[~ours.outside], atol=2e-6)


def mixed_case(
    rng: np.random.Generator, length: int = 48, vocab: int = 200
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], TokenSampling, list[Any]]:
    """Per-token parameters of every kind (greedy included), sampled tokens, and a mask on some
    rows (None elsewhere), one of which excludes its sampled token."""
    logits = rng.normal(0, 2, size=(length, vocab))
    choice = rng.integers(len(CONFIGS) + 1, size=length)
    params = [SamplingParams(temperature=0.0) if c == len(CONFIGS) else CONFIGS[c] for c in choice]
    sampling = TokenSampling.from_spans([(p, 1) for p in params])
    tokens = np.array(
        [rng.choice(vocab, p=reference(r, p)) for r, p in zip(logits, params, strict=True)]
    )
    support: list[Any] = [None] * length
    for t in range(0, length, 5):
        support[t] = np.union1d(rng.choice(vocab, size=30, replace=False), [tokens[t]])
    support[3] = np.setdiff1d(np.arange(10), [tokens[3]])
    return logits, tokens, sampling, support


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_numpy_and_torch_agree(dtype: type[np.floating[Any]]) -> None:
    logits, tokens, sampling, support = mixed_case(np.random.default_rng(5))
    logits = logits.astype(dtype)
    a = behaviour_logprobs(logits, tokens, sampling, support=support)
    b = behaviour_logprobs_torch(
        torch.from_numpy(logits), torch.from_numpy(tokens), sampling, support=support
    )
    assert np.array_equal(a.outside, b.outside.numpy())
    assert a.n_outside == b.n_outside >= 1
    np.testing.assert_allclose(
        b.logprobs.numpy(), a.logprobs, rtol=0, atol=1e-12 if dtype is np.float64 else 2e-5
    )
    assert b.logprobs.dtype == (torch.float64 if dtype is np.float64 else torch.float32)
    half = behaviour_logprobs_torch(torch.from_numpy(logits).bfloat16(), tokens, sampling)
    assert half.logprobs.dtype == torch.float32  # computed in float32, as vLLM does


def test_gradient_flows_through_the_kept_set_only() -> None:
    logits, tokens, sampling, support = mixed_case(np.random.default_rng(9), length=12, vocab=30)
    x = torch.tensor(logits, requires_grad=True)
    out = behaviour_logprobs_torch(x, tokens, sampling, support=support)
    finite = torch.isfinite(out.logprobs)
    assert bool(finite.any()) and bool((finite == ~out.outside).all())
    out.logprobs[finite].sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    kept = np.isfinite(
        np.stack(
            [
                behaviour_logprobs(*all_tokens(r), sampling_row(sampling, t)).logprobs
                for t, r in enumerate(logits)
            ]
        )
    )
    for t in range(len(tokens)):
        if support[t] is None:
            assert bool((x.grad[t][torch.from_numpy(~kept[t])] == 0).all())
        if out.outside[t] or sampling.temperature[t] < 1e-5:
            assert bool((x.grad[t] == 0).all())

    def untruncated(z: Any) -> Any:
        return behaviour_logprobs_torch(z, tokens[:4], SamplingParams(temperature=0.8)).logprobs

    assert torch.autograd.gradcheck(untruncated, (torch.tensor(logits[:4], requires_grad=True),))

    def truncated(z: Any) -> Any:
        params = SamplingParams(temperature=0.9, top_p=0.7, top_k=10)
        return behaviour_logprobs_torch(
            z, tokens[:1] * 0 + int(np.argmax(logits[0])), params
        ).logprobs

    assert torch.autograd.gradcheck(truncated, (torch.tensor(logits[:1], requires_grad=True),))


def sampling_row(sampling: TokenSampling, t: int) -> SamplingParams:
    return SamplingParams(
        float(sampling.temperature[t]),
        float(sampling.top_p[t]),
        int(sampling.top_k[t]),
        float(sampling.min_p[t]),
    )


def test_per_token_params_equal_span_by_span() -> None:
    rng = np.random.default_rng(13)
    spans = [
        (SamplingParams(top_p=0.8), 7),
        (SamplingParams(temperature=0.6, top_k=4), 5),
        (SamplingParams(), 3),
        (SamplingParams(temperature=0.0), 2),
        (SamplingParams(min_p=0.2), 0),
    ]
    logits = rng.normal(0, 2, size=(17, 25))
    tokens = np.array([int(np.argmax(r)) for r in logits])
    merged = behaviour_logprobs(logits, tokens, TokenSampling.from_spans(spans))
    start = 0
    for params, length in spans:
        alone = behaviour_logprobs(
            logits[start : start + length], tokens[start : start + length], params
        )
        np.testing.assert_array_equal(merged.logprobs[start : start + length], alone.logprobs)
        start += length
    assert len(TokenSampling.from_spans(spans)) == 17
    with pytest.raises(ValueError, match="17 rows"):
        behaviour_logprobs(logits, tokens, TokenSampling.broadcast(SamplingParams(), 16))


def test_mask_is_the_support_exactly() -> None:
    rng = np.random.default_rng(17)
    logits = rng.normal(0, 2, size=(4, 20))
    params = SamplingParams(temperature=0.5, top_k=2)  # the mask overrides the truncation
    ids = [np.array([3, 7, 11]), None, np.array([0, 19]), np.array([], dtype=np.int64)]
    tokens = np.array([7, 4, 5, 1])
    got = behaviour_logprobs(logits, tokens, params, support=ids)
    z = logits[0, [3, 7, 11]] / 0.5
    assert got.logprobs[0] == pytest.approx(z[1] - np.log(np.exp(z).sum()), abs=1e-12)
    fallback = behaviour_logprobs(logits[1:2], tokens[1:2], params)
    assert got.logprobs[1] == fallback.logprobs[0]
    assert got.outside.tolist() == [False, bool(fallback.outside[0]), True, True]
    assert got.logprobs[2] == got.logprobs[3] == -np.inf
    dense = np.zeros((4, 20), dtype=bool)
    for t, row in enumerate(ids):
        dense[t, row if row is not None else np.arange(20)] = True
    dense[1] = ~behaviour_logprobs(*all_tokens(logits[1]), params).outside
    assert np.array_equal(
        behaviour_logprobs(logits, tokens, params, support=dense).logprobs, got.logprobs
    )
    torch_dense = behaviour_logprobs_torch(
        torch.from_numpy(logits), tokens, params, support=torch.from_numpy(dense)
    )
    np.testing.assert_allclose(torch_dense.logprobs.numpy(), got.logprobs, atol=1e-12)
    with pytest.raises(ValueError, match="outside"):
        behaviour_logprobs(logits, tokens, params, support=[[20], None, None, None])
    with pytest.raises(ValueError, match="support mask"):
        behaviour_logprobs(logits, tokens, params, support=dense[:3])


def support_of(logits: list[float], params: SamplingParams) -> list[int]:
    row = np.array(logits, dtype=np.float32)
    numpy_side = behaviour_logprobs(*all_tokens(row), params).outside
    torch_side = behaviour_logprobs_torch(
        torch.from_numpy(all_tokens(row)[0]), np.arange(row.size), params
    ).outside
    assert np.array_equal(numpy_side, torch_side.numpy())
    return np.flatnonzero(~numpy_side).tolist()


def test_boundaries_and_ties() -> None:
    quarters = np.log([0.5, 0.25, 0.15, 0.1]).tolist()
    assert support_of(quarters, SamplingParams(top_p=0.65)) == [0, 1]  # the crossing token stays
    assert support_of(quarters, SamplingParams(top_p=0.4)) == [0]  # the top token always stays
    assert support_of(quarters, SamplingParams(top_p=0.5)) == [0]  # a prefix exactly at p: done
    assert support_of(quarters, SamplingParams(top_p=0.5 + 1e-6)) == [0, 1]
    assert support_of([3.0, 1.0, 1.0, 1.0, 0.0], SamplingParams(top_k=2)) == [0, 1, 2, 3]
    assert support_of([2.0, 1.0, 1.0, 0.0], SamplingParams(top_p=0.6)) == [0, 2]  # higher id kept
    assert support_of(np.log([2.0, 1.0]).tolist(), SamplingParams(min_p=0.5)) == [0, 1]
    assert support_of(np.log([2.0, 1.0]).tolist(), SamplingParams(min_p=0.5001)) == [0]
    # top-p runs on what top-k kept, renormalised: 0.5 / 0.75 of the top 2 already reaches 0.6
    assert support_of(quarters, SamplingParams(top_k=2, top_p=0.6)) == [0]
    assert support_of(quarters, SamplingParams(top_k=2, top_p=0.7)) == [0, 1]
    assert support_of(quarters, SamplingParams(top_k=3, top_p=0.55)) == [0]  # 0.5 / 0.9
    # and on what min-p kept: min-p 0.3 drops 0.1, so 0.4 + 0.3 of 0.9 reach 0.75 (not 0.7 of 1)
    tenths = np.log([0.4, 0.3, 0.2, 0.1]).tolist()
    assert support_of(tenths, SamplingParams(top_p=0.75)) == [0, 1, 2]
    assert support_of(tenths, SamplingParams(min_p=0.3, top_p=0.75)) == [0, 1]


def test_greedy_is_a_point_mass_on_the_argmax() -> None:
    logits = np.array([[0.5, 2.0, -1.0, 2.0], [0.5, 2.0, -1.0, 2.0], [0.5, 2.0, -1.0, 2.0]])
    greedy = SamplingParams(temperature=0.0, top_k=1, top_p=0.3)  # truncation ignored
    got = behaviour_logprobs(logits, np.array([1, 3, 0]), greedy)
    assert got.logprobs.tolist() == [0.0, 0.0, -np.inf] and got.outside.tolist() == [
        False,
        False,
        True,
    ]
    x = torch.tensor(logits, requires_grad=True)
    out = behaviour_logprobs_torch(x, np.array([1, 3, 0]), greedy)
    out.logprobs[:2].sum().backward()
    assert x.grad is not None and bool((x.grad == 0).all())
    tiny = behaviour_logprobs(logits[:1], [0], SamplingParams(temperature=0.001))  # raised to 0.01
    assert tiny.logprobs[0] == pytest.approx(50.0 - 200.0 - np.log(2.0), abs=1e-9)


def test_untruncated_temperature_one_is_log_softmax() -> None:
    row = np.random.default_rng(19).normal(0, 3, size=(1, 50))
    want = row[0] - np.log(np.exp(row[0] - row.max()).sum()) - row.max()
    for token in (0, 17, 49):
        got = behaviour_logprobs(row, [token], SamplingParams())
        assert got.logprobs[0] == pytest.approx(want[token], abs=1e-12)
        tt = behaviour_logprobs_torch(torch.from_numpy(row), [token], SamplingParams(top_k=50))
        assert float(tt.logprobs[0]) == pytest.approx(want[token], abs=1e-12)  # top_k >= V is off


def test_sampling_params_from_request() -> None:
    assert SamplingParams.from_request({"messages": []}) == SamplingParams()
    request = {"temperature": 0.7, "top_p": 0.8, "top_k": -1, "min_p": None}
    assert SamplingParams.from_request(request, {"min_p": 0.05, "top_k": 20}) == SamplingParams(
        temperature=0.7, top_p=0.8, top_k=0, min_p=0.05
    )
    assert SamplingParams.from_request({}, {"temperature": 0.6, "top_p": 0.95}).as_dict() == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 0,
        "min_p": 0.0,
    }
    generate = {"token_ids": [1, 2], "sampling_params": {"top_k": 20}}
    assert SamplingParams.from_request(generate, {"temperature": 0.6}) == SamplingParams(top_k=20)
    assert SamplingParams.from_request({"temperature": 0.004}).temperature == 0.01
    greedy = SamplingParams.from_request({"temperature": 0, "top_p": 0.5, "top_k": 3})
    assert (
        greedy == SamplingParams(temperature=0.0) and greedy.is_greedy and not greedy.is_truncated
    )
    assert [p.is_truncated for p in CONFIGS] == [False, False, True, True, True, True, True]
    assert [p.is_plain for p in CONFIGS[:3]] == [True, False, False]
    for bad in ({"temperature": "1"}, {"top_p": True}, {"top_k": 2.5}, {"top_p": 0}, {"min_p": 2}):
        with pytest.raises(ValueError):
            SamplingParams.from_request(bad)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)


def test_shape_and_id_errors() -> None:
    logits = np.zeros((3, 5))
    with pytest.raises(ValueError, match=r"\[T, V\]"):
        behaviour_logprobs(logits, [0, 1], SamplingParams())
    with pytest.raises(ValueError, match="token ids"):
        behaviour_logprobs(logits, [0, 1, 5], SamplingParams())
    with pytest.raises(ValueError, match="one length"):
        TokenSampling(np.ones(3), np.ones(3), np.zeros(2), np.zeros(3))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("params", "needed"),
    [
        (None, False),  # a span that does not say how it was sampled
        (SamplingParams(), False),
        (SamplingParams(temperature=0.7), True),
        (SamplingParams(top_k=5), True),
        (SamplingParams(top_p=0.9), True),
        (SamplingParams(min_p=0.1), True),
    ],
)
def test_samples_need_behaviour_logprobs_only_when_a_span_was_tempered_or_truncated(
    params: SamplingParams | None, needed: bool
) -> None:
    plain, sample = synthetic_sample(0), synthetic_sample(1)
    sample.spans[0].sampling = params
    assert needs_behaviour_logprobs([plain, sample]) is needed
    assert needs_behaviour_logprobs([plain]) is False

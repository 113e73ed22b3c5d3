"""Generic layouts: padded (left / right), prompt-left + response-right, packed, shifted, torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.convert_samples import build_sample, merged_sample, single_sample
from tito_agents import ConfigurationError, Sample
from tito_agents.convert import (
    IGNORE_INDEX,
    ConversionError,
    pack_batch,
    pack_batches,
    pad_batch,
    pad_split_batch,
)

MERGED_IDS = [101, 102, 103, 104, 201, 202, 301, 302, 303, 203, 204, 205, 304, 206]
MERGED_LOSS = [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 1]
SINGLE_IDS = [111, 112, 211, 212, 213, 214]
SINGLE_LOSS = [0, 0, 1, 1, 1, 1]


def lp(ids: list[int], loss: list[int]) -> list[float]:
    """Expected rollout logprobs: the hand-built value on trained tokens, 0.0 elsewhere."""
    return [-t / 1000.0 if m else 0.0 for t, m in zip(ids, loss, strict=True)]


def test_right_padding_places_every_token_mask_bit_and_logprob() -> None:
    """Right padding keeps each sample at column 0, pads after it with id/attention/loss/logprob 0."""
    batch = pad_batch([merged_sample(), single_sample()], padding_side="right", pad_id=0)
    assert batch.input_ids.shape == (2, 14)
    assert batch.input_ids.tolist() == [MERGED_IDS, [*SINGLE_IDS, *[0] * 8]]
    assert batch.loss_mask.tolist() == [MERGED_LOSS, [*SINGLE_LOSS, *[0] * 8]]
    assert batch.attention_mask.tolist() == [[1] * 14, [1] * 6 + [0] * 8]
    assert batch.position_ids.tolist() == [list(range(14)), [0, 1, 2, 3, 4, 5] + [5] * 8]
    assert batch.logprobs is not None
    np.testing.assert_array_equal(
        batch.logprobs,
        np.array(
            [lp(MERGED_IDS, MERGED_LOSS), lp(SINGLE_IDS, SINGLE_LOSS) + [0.0] * 8], np.float32
        ),
    )
    assert batch.lengths.tolist() == [14, 6]
    assert batch.sample_ids == ("merged", "single")


def test_left_padding_ends_every_sample_at_the_last_column() -> None:
    """Left padding puts pads first; positions count from 0 at each sample's first real token."""
    batch = pad_batch([merged_sample(), single_sample()], padding_side="left", pad_id=7)
    assert batch.input_ids[1].tolist() == [7] * 8 + SINGLE_IDS
    assert batch.loss_mask[1].tolist() == [0] * 8 + SINGLE_LOSS
    assert batch.attention_mask[1].tolist() == [0] * 8 + [1] * 6
    assert batch.position_ids[1].tolist() == [0] * 8 + list(range(6))
    assert batch.logprobs is not None
    assert batch.logprobs[1].tolist() == pytest.approx([0.0] * 8 + lp(SINGLE_IDS, SINGLE_LOSS))
    assert batch.input_ids[0].tolist() == MERGED_IDS


def test_padding_width_multiple_and_missing_logprobs() -> None:
    """`pad_to_multiple_of` rounds the width up; one sample without logprobs drops the field."""
    batch = pad_batch([merged_sample(), single_sample(with_logprobs=False)], pad_to_multiple_of=8)
    assert batch.input_ids.shape == (2, 16)
    assert batch.logprobs is None
    assert "logprobs" not in batch.arrays()


def test_overflow_errors_or_truncates_the_tail() -> None:
    """A sample longer than `width` is refused, or cut to its first `width` tokens and flagged."""
    with pytest.raises(ConversionError, match="merged"):
        pad_batch([merged_sample(), single_sample()], width=6)
    batch = pad_batch([merged_sample(), single_sample()], width=6, overflow="truncate")
    assert batch.input_ids.tolist() == [MERGED_IDS[:6], SINGLE_IDS]
    assert batch.loss_mask.tolist() == [MERGED_LOSS[:6], SINGLE_LOSS]
    assert batch.truncated.tolist() == [True, False]


def test_split_batch_puts_context_after_the_first_sampled_token_in_the_response() -> None:
    """Prompt = tokens before the first sampled one, left-padded; the rest (tool results and all)
    is the right-padded response with loss 0 on its context tokens."""
    batch = pad_split_batch([merged_sample(), single_sample()], pad_id=0)
    assert (batch.prompt_width, batch.response_width) == (4, 10)
    assert batch.prompt_ids.tolist() == [[101, 102, 103, 104], [0, 0, 111, 112]]
    assert batch.prompt_mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert batch.response_ids.tolist() == [MERGED_IDS[4:], [211, 212, 213, 214] + [0] * 6]
    assert batch.response_attention_mask.tolist() == [[1] * 10, [1] * 4 + [0] * 6]
    assert batch.response_loss_mask.tolist() == [
        [1, 1, 0, 0, 0, 1, 1, 1, 0, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
    ]
    assert batch.response_logprobs is not None
    assert batch.response_logprobs.tolist() == [
        pytest.approx(lp(MERGED_IDS, MERGED_LOSS)[4:]),
        pytest.approx([-0.211, -0.212, -0.213, -0.214] + [0.0] * 6),
    ]
    assert batch.input_ids[1].tolist() == [0, 0, 111, 112, 211, 212, 213, 214] + [0] * 6
    assert batch.position_ids[1].tolist() == [0, 0, 0, 1, 2, 3, 4, 5] + [5] * 6
    assert batch.loss_mask[:, :4].sum() == 0
    assert batch.prompt_lengths.tolist() == [4, 2]
    assert batch.response_lengths.tolist() == [10, 4]


def test_split_batch_truncation_keeps_prompt_end_and_response_head() -> None:
    """Truncating keeps the newest prompt tokens and the first response tokens."""
    batch = pad_split_batch(
        [merged_sample(), single_sample()], prompt_width=2, response_width=3, overflow="truncate"
    )
    assert batch.prompt_ids.tolist() == [[103, 104], [111, 112]]
    assert batch.response_ids.tolist() == [[201, 202, 301], [211, 212, 213]]
    assert batch.response_loss_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.truncated.tolist() == [True, True]
    with pytest.raises(ConversionError, match="widths 2 / 3"):
        pad_split_batch([merged_sample()], prompt_width=2, response_width=3)


def test_shifted_targets_predict_the_next_trained_token() -> None:
    """Shifted labels hold token t+1 where it is trained, -100 elsewhere and at each sequence end."""
    x = IGNORE_INDEX
    merged_labels = [x, x, x, 201, 202, x, x, x, 203, 204, 205, x, 206, x]
    padded = pad_batch([merged_sample(), single_sample()], padding_side="right").shifted()
    assert padded.labels.tolist() == [merged_labels, [x, 211, 212, 213, 214, x] + [x] * 8]
    assert padded.loss_mask[1].tolist() == [0, 1, 1, 1, 1, 0] + [0] * 8
    assert padded.logprobs is not None
    assert padded.logprobs[1, :6].tolist() == pytest.approx(
        [0.0, -0.211, -0.212, -0.213, -0.214, 0]
    )
    left = pad_batch([merged_sample(), single_sample()], padding_side="left").shifted()
    assert left.labels[1].tolist() == [x] * 8 + [x, 211, 212, 213, 214, x]
    split = pad_split_batch([merged_sample(), single_sample()]).shifted()
    assert split.labels[0].tolist() == merged_labels
    assert split.labels[1].tolist() == [x, x, x, 211, 212, 213, 214, x] + [x] * 6


def test_shifted_targets_have_arrays_and_tensors_like_the_batch() -> None:
    """What `.shifted()` returns has `.arrays()` and `.to_torch()` (int64 labels and mask,
    float32 logprobs), and a causal-LM loss runs on the labels as given."""
    for batch in (
        pad_batch([merged_sample(), single_sample()]),
        pad_split_batch([merged_sample(), single_sample()]),
        pack_batch([merged_sample(), single_sample()]),
    ):
        shifted = batch.shifted()
        arrays = shifted.arrays()
        assert sorted(arrays) == ["labels", "logprobs", "loss_mask"]
        assert arrays["labels"] is shifted.labels
        tensors = shifted.to_torch()
        assert tensors["labels"].dtype == torch.int64 and tensors["loss_mask"].dtype == torch.int64
        assert tensors["logprobs"].dtype == torch.float32
        assert tensors["labels"].tolist() == shifted.labels.tolist()
        logits = torch.zeros(*tensors["labels"].shape, 300)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 300), tensors["labels"].reshape(-1), ignore_index=IGNORE_INDEX
        )
        assert loss.item() == pytest.approx(np.log(300), rel=1e-5)  # uniform over 300 ids
    no_logprobs = pad_batch([single_sample(with_logprobs=False)]).shifted()
    assert "logprobs" not in no_logprobs.arrays() and "logprobs" not in no_logprobs.to_torch()


def test_packed_batch_concatenates_and_restarts_positions() -> None:
    """Packing lays samples end to end with cu_seqlens and per-sequence positions and advantages."""
    packed = pack_batch([merged_sample(), single_sample()], advantages=[0.5, -1.5])
    assert packed.input_ids.tolist() == MERGED_IDS + SINGLE_IDS
    assert packed.loss_mask.tolist() == MERGED_LOSS + SINGLE_LOSS
    assert packed.position_ids.tolist() == list(range(14)) + list(range(6))
    assert packed.cu_seqlens.tolist() == [0, 14, 20]
    assert packed.cu_seqlens.dtype == np.int32
    assert packed.max_seqlen == 14
    assert packed.sequence_ids.tolist() == [0] * 14 + [1] * 6
    assert packed.advantages is not None
    assert packed.advantages.tolist() == [0.5] * 14 + [-1.5] * 6
    assert packed.logprobs is not None
    assert packed.logprobs.tolist() == pytest.approx(
        lp(MERGED_IDS, MERGED_LOSS) + lp(SINGLE_IDS, SINGLE_LOSS)
    )
    x = IGNORE_INDEX
    labels = packed.shifted().labels.tolist()
    assert labels[13] == x  # the merged sample's last token does not predict the next sample
    assert labels[14:] == [x, 211, 212, 213, 214, x]


def test_pack_batches_respects_the_token_budget() -> None:
    """Samples go, in order, into rows of at most `token_budget` tokens; none is ever cut."""
    samples = [merged_sample(), single_sample(), single_sample()]
    rows = pack_batches(samples, 20, advantages=[1.0, 2.0, 3.0])
    assert [r.cu_seqlens.tolist() for r in rows] == [[0, 14, 20], [0, 6]]
    assert rows[1].advantages is not None and rows[1].advantages.tolist() == [3.0] * 6
    with pytest.raises(ConversionError, match="token_budget 10"):
        pack_batches(samples, 10)


def test_to_torch_gives_trainer_dtypes_with_the_same_values() -> None:
    """`.to_torch()` turns ids, masks and positions into int64 and logprobs into float32 tensors."""
    padded = pad_batch([merged_sample(), single_sample()])
    tensors = padded.to_torch()
    assert tensors["input_ids"].dtype == torch.int64
    assert tensors["attention_mask"].dtype == torch.int64
    assert tensors["logprobs"].dtype == torch.float32
    assert tensors["input_ids"].tolist() == padded.input_ids.tolist()
    packed = pack_batch([merged_sample(), single_sample()]).to_torch()
    assert packed["cu_seqlens"].dtype == torch.int32
    assert packed["position_ids"].tolist() == list(range(14)) + list(range(6))
    split = pad_split_batch([merged_sample(), single_sample()]).to_torch()
    assert split["response_loss_mask"].tolist()[0] == [1, 1, 0, 0, 0, 1, 1, 1, 0, 1]


def test_a_pad_never_predicts_a_trained_first_token() -> None:
    """With left padding, a sample whose first token is trained gets no label from the pad before it."""
    first_trained = build_sample([("gen", [5, 6]), ("ctx", [7])], sample_id="f")
    batch = pad_batch([first_trained, merged_sample()], padding_side="left")
    x = IGNORE_INDEX
    assert batch.shifted().labels[0].tolist() == [x] * 10 + [x, 6, x, x]
    split = pad_split_batch([first_trained, merged_sample()]).shifted()
    assert split.labels[0].tolist() == [x, x, x, x, 6, x, x] + [x] * 7


def test_to_torch_without_torch_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch is missing, numpy output still works and `.to_torch()` raises with a hint."""
    from tito_agents.convert import _arrays

    monkeypatch.setattr(_arrays, "_torch_or_none", lambda: None)
    batch = pad_batch([single_sample()])
    assert batch.input_ids.tolist() == [SINGLE_IDS]
    assert not _arrays.torch_available()
    with pytest.raises(ConfigurationError, match="pip install torch"):
        batch.to_torch()


def test_samples_are_not_modified() -> None:
    """Converters read samples and never write them (arrays stay unshifted and unpadded)."""
    sample = merged_sample()
    before = (sample.token_ids.copy(), sample.loss_mask.copy(), sample.logprobs)
    assert before[2] is not None
    before_lp = before[2].copy()
    padded = pad_batch([sample])
    padded.input_ids[0, 0] = -1
    pack_batch([sample]).input_ids[0] = -1
    assert sample.token_ids.tolist() == before[0].tolist()
    assert sample.loss_mask.tolist() == before[1].tolist()
    assert sample.logprobs is not None and sample.logprobs.tolist() == before_lp.tolist()


pieces_strategy = st.lists(
    st.tuples(
        st.sampled_from(["ctx", "gen"]),
        st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=6),
    ),
    min_size=1,
    max_size=6,
).filter(lambda ps: any(k == "gen" for k, _ in ps))


def _samples(pieces_list: list[list[tuple[str, list[int]]]]) -> list[Sample]:
    return [build_sample(p, sample_id=f"s{i}") for i, p in enumerate(pieces_list)]


@settings(max_examples=60, deadline=None)
@given(st.lists(pieces_strategy, min_size=1, max_size=5), st.sampled_from(["left", "right"]))
def test_every_layout_conserves_each_sample(
    pieces_list: list[list[tuple[str, list[int]]]], side: str
) -> None:
    """Each layout holds every sample's ids, loss bits and logprobs exactly once, where it says."""
    samples = _samples(pieces_list)
    padded = pad_batch(samples, padding_side=side, pad_id=0)  # type: ignore[arg-type]
    split = pad_split_batch(samples)
    packed = pack_batch(samples)
    assert padded.logprobs is not None and split.logprobs is not None
    assert packed.logprobs is not None
    for b, s in enumerate(samples):
        valid = padded.attention_mask[b].astype(bool)
        np.testing.assert_array_equal(padded.input_ids[b][valid], s.token_ids)
        np.testing.assert_array_equal(padded.loss_mask[b][valid], s.loss_mask)
        np.testing.assert_array_equal(padded.logprobs[b][valid], s.logprobs)
        assert padded.loss_mask[b][~valid].sum() == 0
        keep = split.attention_mask[b].astype(bool)
        np.testing.assert_array_equal(split.input_ids[b][keep], s.token_ids)
        np.testing.assert_array_equal(split.loss_mask[b][keep], s.loss_mask)
        np.testing.assert_array_equal(split.logprobs[b][keep], s.logprobs)
        np.testing.assert_array_equal(split.position_ids[b][keep], np.arange(s.num_tokens))
        lo, hi = packed.cu_seqlens[b], packed.cu_seqlens[b + 1]
        np.testing.assert_array_equal(packed.input_ids[lo:hi], s.token_ids)
        np.testing.assert_array_equal(packed.loss_mask[lo:hi], s.loss_mask)
        np.testing.assert_array_equal(packed.position_ids[lo:hi], np.arange(s.num_tokens))
    assert int(split.loss_mask[:, : split.prompt_width].sum()) == 0
    shifted = {"padded": padded.shifted(), "split": split.shifted(), "packed": packed.shifted()}
    for b, s in enumerate(samples):
        # token t predicts t+1: a label where t+1 is trained, -100 elsewhere and after the last
        expected = np.append(np.where(s.loss_mask[1:] == 1, s.token_ids[1:], IGNORE_INDEX), -100)
        valid = padded.attention_mask[b].astype(bool)
        np.testing.assert_array_equal(shifted["padded"].labels[b][valid], expected)
        assert (shifted["padded"].labels[b][~valid] == IGNORE_INDEX).all()
        keep = split.attention_mask[b].astype(bool)
        np.testing.assert_array_equal(shifted["split"].labels[b][keep], expected)
        assert (shifted["split"].labels[b][~keep] == IGNORE_INDEX).all()
        lo, hi = packed.cu_seqlens[b], packed.cu_seqlens[b + 1]
        np.testing.assert_array_equal(shifted["packed"].labels[lo:hi], expected)
    for layout in (padded, split):  # verl's compute_position_id_with_mask, literally
        cumsum = np.cumsum(layout.attention_mask, axis=1, dtype=np.int64) - 1
        np.testing.assert_array_equal(layout.position_ids, np.maximum(cumsum, 0))
    assert int(padded.loss_mask.sum()) == sum(s.num_trained for s in samples)

"""The tests that keep the command tests' helpers (tests/support/cli_samples.py) honest."""

from __future__ import annotations

import numpy as np

from tests.support.cli_samples import merged_episode, trl_templates


def test_hand_built_samples_keep_the_sample_invariants() -> None:
    """Every hand-built sample validates, and trained positions are exactly the spans' sampled ids."""
    for sample in merged_episode():
        sample.validate()
        expected = np.zeros(sample.num_tokens, dtype=np.uint8)
        for span in sample.spans:
            expected[span.start : span.end] = 1
        assert np.array_equal(sample.loss_mask, expected)


def test_the_rewritten_history_really_diverges_where_documented() -> None:
    """B shares exactly 7 ids with A and C shares exactly 11 with B, as the docstring says."""
    a, b, c, *_ = merged_episode()
    assert np.array_equal(a.token_ids[:7], b.token_ids[:7]) and a.token_ids[7] != b.token_ids[7]
    assert np.array_equal(b.token_ids[:11], c.token_ids[:11]) and b.token_ids[11] != c.token_ids[11]


def test_trl_ships_chat_templates_of_many_families() -> None:
    """The trl package installed for the audit tests ships real templates of many model families."""
    families = {p.stem.split("_")[0] for p in trl_templates()}
    assert len(trl_templates()) >= 35, "pip install trl (a dev dependency of the template audit)"
    assert {"qwen3", "llama3", "gemma", "phi3", "deepseekv3", "gptoss"} <= families

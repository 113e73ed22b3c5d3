"""The trainer's view of captured samples: importance ratios, a text-pipeline baseline, one step.

Loads the weights the CPU vLLM serves into transformers (fp32 or bf16), feeds it every converter
layout the way its trainer does (`layouts`), and reports how far the trainer's logprobs are from
the rollout logprobs on every trained token (`ratio_stats.RatioStats`), beside the same episodes
rebuilt as a text-based collector would (`text_pipeline`; both side by side: `side_by_side`).
`step.grpo_step` runs one clipped-surrogate GRPO step on the packed converter output and
`step.save_policy` writes the weights for vLLM. Samples sampled tempered or truncated are also
scored against behaviour logprobs (`behaviour_ratios`; measured per configuration by
`python -m tito_agents.trainer_check.sampling_run`).

Needs torch and transformers (`pip install '.[trainer-check]'` in a checkout), imported on first use.
See docs/trainer-check.md.
"""

from __future__ import annotations

from tito_agents.trainer_check.behaviour_ratios import BehaviourFigures, behaviour_figures
from tito_agents.trainer_check.layouts import LAYOUTS, TokenScores, score_layout
from tito_agents.trainer_check.model import load_policy, load_tokenizer, next_token_logprobs
from tito_agents.trainer_check.ratio_stats import CLIP, RatioStats
from tito_agents.trainer_check.side_by_side import (
    Comparison,
    PipelineFigures,
    compare,
    constrained_calls,
    constrained_mask,
    masked_rollout,
)
from tito_agents.trainer_check.step import StepResult, grpo_step, save_policy

__all__ = [
    "CLIP",
    "LAYOUTS",
    "BehaviourFigures",
    "Comparison",
    "PipelineFigures",
    "RatioStats",
    "StepResult",
    "TokenScores",
    "behaviour_figures",
    "compare",
    "constrained_calls",
    "constrained_mask",
    "grpo_step",
    "load_policy",
    "load_tokenizer",
    "masked_rollout",
    "next_token_logprobs",
    "save_policy",
    "score_layout",
]

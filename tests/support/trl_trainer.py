"""A TRL GRPOTrainer on a tiny randomly initialised Llama over the SmolLM2 tokenizer (no download):
the converter tests check what TRL builds from our values, not what it learns."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns on every experimental import
import trl

from tito_agents.convert import passthrough_reward


def grpo_trainer(
    tokenizer: Any, tmp_path: Path, rollout_func: Callable[[list[Any], Any], dict[str, Any]]
) -> Any:
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=256,
        )
    )
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        mask_truncated_completions=False,
        disable_tqdm=True,
    )
    return trl.GRPOTrainer(
        model=model,
        reward_funcs=passthrough_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}),
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )

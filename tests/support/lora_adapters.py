"""Two small LoRA adapters on the served SmolLM2, made with peft for the multi-policy e2e check
(tests/e2e/test_policies_real.py): rank 8 on the attention projections, A and B both random and
non-zero (peft's default zero B would leave each adapter equal to the base model), so each
adapter's distribution differs clearly from the other's and the base model's."""

from __future__ import annotations

import warnings
from pathlib import Path


def make_adapters(
    model_dir: Path, out: Path, names: tuple[str, ...] = ("a", "b")
) -> dict[str, Path]:
    """One adapter folder per name under `out` (made once: an existing one is reused).
    peft's and transformers' own deprecation warnings are theirs: silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _make(model_dir, out, names)


def _make(model_dir: Path, out: Path, names: tuple[str, ...]) -> dict[str, Path]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    made: dict[str, Path] = {}
    for seed, name in enumerate(names):
        folder = out / name
        made[name] = folder
        if (folder / "adapter_config.json").exists():
            continue
        torch.manual_seed(1000 + seed)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        config = LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            init_lora_weights=False,
            lora_dropout=0.0,
        )
        model = get_peft_model(base, config)
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "lora_" in param_name:
                    param.copy_(torch.randn_like(param) * 0.15)
        model.save_pretrained(str(folder))
    return made

"""The trainer-side policy: the served weights loaded into transformers, and next-token logprobs.

`load_policy` reads the same safetensors folder vLLM serves (bf16 on disk) in the dtype a trainer
computes in (fp32 upcasts exactly; bf16 keeps the served values). `next_token_logprobs` runs one
forward pass over a laid-out batch and returns, at every position t, the logprob of the token the
layout puts at t + 1: the same shift a causal-LM loss uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tito_agents.trainer_check import _deps

DTYPES = ("fp32", "bf16")


def torch_dtype(name: str) -> Any:
    """`"fp32"` / `"bf16"` as a torch dtype."""
    torch = _deps.torch()
    try:
        return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {DTYPES}, got {name!r}") from None


def load_policy(path: str | Path, dtype: str = "fp32") -> Any:
    """A `transformers` causal LM from the served model folder, in eval mode, in `dtype`."""
    transformers = _deps.transformers()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch_dtype(dtype), attn_implementation="sdpa"
    )
    model.eval()
    return model


def load_tokenizer(path: str | Path) -> Any:
    """The served model's tokenizer (only the text pipeline and reports use it, never capture)."""
    return _deps.transformers().AutoTokenizer.from_pretrained(str(path))


def block_causal_mask(sequence_ids: npt.NDArray[Any]) -> Any:
    """`[1, 1, N, N]` boolean mask for a packed row: causal, and no token sees another sequence.

    What flash-attn's `cu_seqlens` does for a padding-free trainer; SDPA on CPU needs it spelled
    out (transformers only infers packing from `position_ids` for flash kernels).
    """
    torch = _deps.torch()
    seq = torch.from_numpy(np.asarray(sequence_ids, dtype=np.int64))
    n = int(seq.shape[0])
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return (causal & (seq[:, None] == seq[None, :]))[None, None]


def logits_of(
    model: Any,
    input_ids: npt.NDArray[Any],
    *,
    attention_mask: Any = None,
    position_ids: npt.NDArray[Any] | None = None,
) -> Any:
    """Float32 logits `[B, T, V]` of one forward pass (no grad), inputs as the layout gives them."""
    torch = _deps.torch()
    kwargs: dict[str, Any] = {"input_ids": torch.from_numpy(np.asarray(input_ids, np.int64))}
    if attention_mask is not None:
        if isinstance(attention_mask, np.ndarray):
            attention_mask = torch.from_numpy(attention_mask.astype(np.int64))
        kwargs["attention_mask"] = attention_mask
    if position_ids is not None:
        kwargs["position_ids"] = torch.from_numpy(np.asarray(position_ids, np.int64))
    with torch.no_grad():
        return model(**kwargs).logits.float()


def gather_logprobs(logits: Any, targets: Any) -> Any:
    """`log_softmax(logits)[..., target]` without materialising the whole log-softmax."""
    torch = _deps.torch()
    safe = torch.clamp(targets, min=0)
    picked = logits.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def next_token_logprobs(
    model: Any,
    input_ids: npt.NDArray[Any],
    *,
    attention_mask: Any = None,
    position_ids: npt.NDArray[Any] | None = None,
) -> npt.NDArray[np.float64]:
    """`[B, T]`: at t, the model's logprob of `input_ids[:, t + 1]` (NaN in the last column)."""
    torch = _deps.torch()
    logits = logits_of(model, input_ids, attention_mask=attention_mask, position_ids=position_ids)
    ids = torch.from_numpy(np.asarray(input_ids, np.int64))
    out = np.full(ids.shape, np.nan, dtype=np.float64)
    out[:, :-1] = gather_logprobs(logits[:, :-1], ids[:, 1:]).double().numpy()
    return out

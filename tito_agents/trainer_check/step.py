"""One policy-gradient step on converter output, and the updated weights written for vLLM.

The loss is GRPO's clipped surrogate on a packed batch (`pack_batch` with `group_advantages`), the
minimal form every PPO-style trainer computes, token-mean over the trained tokens:

    ratio_t = exp(logp_new_t - logp_old_t)
    loss    = -mean_t min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A)

`logp_old` is the rollout logprob the sample carries (`Sample.ratio_logprobs`: its
`policy_logprobs` where a constrained span was re-scored). When spans were sampled tempered or
truncated (`CallSpan.sampling`) and their rollout logprobs are the processed ones
(`logprobs_mode`), `logp_new` is the behaviour logprob (`behaviour_logprobs_torch`: the
distribution the engine sampled from, rebuilt from the trainer's logits); a sampled token outside
the support the trainer computes is left out of the loss. (Raw rollout logprobs of such spans
cannot be corrected from the sample: the step keeps the full softmax, and `tito-agents stats`
warns.) Tokens sampled under a constraint and not re-scored have no usable rollout logprob (vLLM
returns the grammar-masked distribution's), so they take the trainer's own detached value: ratio
1, a plain on-policy gradient. No KL term, no entropy bonus, one optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tito_agents.convert import (
    IGNORE_INDEX,
    TokenSampling,
    behaviour_logprobs_torch,
    group_advantages,
    pack_batch,
)
from tito_agents.samples import Sample
from tito_agents.sampling import PROCESSED_LOGPROBS
from tito_agents.trainer_check import _deps
from tito_agents.trainer_check.model import block_causal_mask, gather_logprobs
from tito_agents.trainer_check.ratio_stats import CLIP


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step did."""

    loss: float
    tokens: int
    """Trained tokens in the loss."""
    clipped: int
    """Tokens whose ratio was clipped (no gradient through them)."""
    advantages: list[float]
    grad_norm: float
    changed_bf16: float
    """Fraction of parameters whose bf16 value (what vLLM serves) changed."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def old_logprobs(sample: Sample, masked: np.ndarray) -> np.ndarray:
    """The old policy's logprob of each token for the ratio (`Sample.ratio_logprobs`: re-scored
    policy logprobs where present, else the rollout's); NaN where `masked` (a constrained token
    whose only logprob is the grammar-masked distribution's)."""
    ratio = getattr(sample, "ratio_logprobs", None)
    values = ratio() if callable(ratio) else sample.logprobs
    if values is None:
        raise ValueError(f"sample {sample.sample_id}: no rollout logprobs")
    return np.where(masked, np.nan, values.astype(np.float64))


def _processed(samples: Sequence[Sample]) -> bool:
    """Every tempered or truncated span holds processed logprobs (what sampled)."""
    return all(
        span.logprobs_mode == PROCESSED_LOGPROBS
        for sample in samples
        for span in sample.spans
        if span.sampling is not None
        and (span.sampling.temperature != 1.0 or span.sampling.is_truncated)
    )


def grpo_step(
    model: Any,
    optimizer: Any,
    samples: Sequence[Sample],
    masked: Sequence[np.ndarray],
    *,
    clip: float = CLIP,
) -> StepResult:
    """One clipped-surrogate step on `samples` (fp32 `model`, any torch optimizer).

    `masked[b]` marks the tokens of `samples[b]` whose rollout logprobs cannot serve as the old
    policy's (`compare.masked_rollout`): they take the trainer's own detached value (ratio 1).
    """
    torch = _deps.torch()
    advantages = group_advantages(samples, unit="episode", missing_reward="exclude")
    batch = pack_batch(samples, advantages=advantages)
    targets = batch.shifted()
    old = np.concatenate([old_logprobs(s, m) for s, m in zip(samples, masked, strict=True)])
    # shifted like the targets: position t holds token t + 1's old logprob
    old_shifted = np.full(batch.num_tokens, np.nan)
    old_shifted[:-1] = old[1:]
    keep = targets.labels != IGNORE_INDEX
    assert batch.advantages is not None

    model.train()
    ids = torch.from_numpy(batch.input_ids.astype(np.int64))[None]
    positions = torch.from_numpy(batch.position_ids.astype(np.int64))[None]
    logits = model(
        input_ids=ids,
        position_ids=positions,
        attention_mask=block_causal_mask(batch.sequence_ids),
    ).logits.float()[0]
    index = torch.from_numpy(np.flatnonzero(keep))
    labels = torch.from_numpy(targets.labels.astype(np.int64))[index]
    inside = torch.ones(labels.shape[0], dtype=torch.bool)
    if targets.sampling is None or not _processed(samples):
        new = gather_logprobs(logits[index], labels)
    else:  # the distribution the engine sampled from, per token
        per_token = TokenSampling(
            *(targets.sampling[name][keep] for name in ("temperature", "top_p", "top_k", "min_p"))
        )
        behaviour = behaviour_logprobs_torch(logits[index], labels, per_token)
        inside = ~behaviour.outside
        new = torch.where(inside, behaviour.logprobs, torch.zeros_like(behaviour.logprobs))
    old_t = torch.from_numpy(old_shifted[keep]).float()
    old_t = torch.where(torch.isnan(old_t) | ~inside, new.detach(), old_t)
    adv = torch.from_numpy(batch.advantages[keep].astype(np.float32))
    ratio = torch.exp(new - old_t)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    loss = -(surrogate * inside).sum() / inside.sum().clamp(min=1)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    before = [p.detach().to(torch.bfloat16).clone() for p in model.parameters()]
    optimizer.step()
    changed = total = 0
    for p, b in zip(model.parameters(), before, strict=True):
        changed += int((p.detach().to(torch.bfloat16) != b).sum())
        total += b.numel()
    model.eval()
    clipped = int(((ratio < 1 - clip) | (ratio > 1 + clip)).sum())
    return StepResult(
        loss=float(loss.detach()),
        tokens=int(keep.sum()),
        clipped=clipped,
        advantages=[float(a) for a in advantages],
        grad_norm=grad_norm,
        changed_bf16=changed / total if total else 0.0,
    )


def save_policy(model: Any, tokenizer: Any, source: str | Path, out_dir: str | Path) -> Path:
    """Write the updated weights as vLLM loads them: bf16 safetensors, with the source folder's
    tokenizer, generation config and chat template, into `out_dir`."""
    import shutil

    torch = _deps.torch()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # One bf16 copy per storage, so tied weights (SmolLM2's lm_head) stay tied and are written once.
    copies: dict[int, Any] = {}
    state = {
        k: copies.setdefault(v.data_ptr(), v.detach().to(torch.bfloat16))
        for k, v in model.state_dict().items()
    }
    model.save_pretrained(str(out), state_dict=state)
    tokenizer.save_pretrained(str(out))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (Path(source) / name).is_file():
            shutil.copy2(Path(source) / name, out / name)
    return out

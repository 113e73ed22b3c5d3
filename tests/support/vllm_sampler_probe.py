"""Draw tokens with vLLM's own v1 sampler, run as a script by the vLLM venv's python (not imported).

Reads JSON on stdin: `logits` (`[R, V]`), per-row `temperature`, `top_p`, `top_k`, `min_p`,
`repeats` and `seed`. Each row is repeated `repeats` times in one batch, so one call of
`vllm.v1.sample.sampler.Sampler` (logprobs mode `processed_logprobs`, the CPU build's sampler: min-p
processor, `apply_top_k_top_p`, the fused Gumbel argmax) draws `repeats` tokens per row. Writes JSON:
`counts` (`[R, V]`, how often each token was drawn) and `processed` (`[R, V]`, the processed logprobs
vLLM returns for the row, null for -inf). The test compares both to `behaviour_logprobs`.
"""

from __future__ import annotations

import json
import math
import sys


def main() -> None:
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    spec = json.load(sys.stdin)
    torch.manual_seed(spec["seed"])
    base = torch.tensor(spec["logits"], dtype=torch.float32)
    rows, vocab = base.shape
    repeats = spec["repeats"]

    def column(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(spec[name], dtype=dtype).repeat_interleave(repeats)

    logits = base.repeat_interleave(repeats, dim=0)
    temperature = column("temperature", torch.float32)
    top_k = column("top_k", torch.int32)
    top_k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)  # gpu_input_batch.py:407-412
    top_p = column("top_p", torch.float32)
    min_p = column("min_p", torch.float32)
    greedy = temperature < 1e-5
    processors = []
    if bool((min_p > 0).any()):
        min_p_processor = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
        min_p_processor.min_p_count = int((min_p > 0).sum())
        min_p_processor.min_p = min_p.unsqueeze(1)
        processors.append(min_p_processor)
    batch = logits.shape[0]
    metadata = SamplingMetadata(
        temperature=torch.where(greedy, 0.0, temperature),
        all_greedy=bool(greedy.all()),
        all_random=not bool(greedy.any()),
        top_p=top_p if bool((top_p < 1).any()) else None,
        top_k=top_k if bool((top_k < vocab).any()) else None,
        generators={},
        max_num_logprobs=-1,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(processors),
    )
    out = Sampler(logprobs_mode="processed_logprobs")(logits.clone(), metadata)
    sampled = out.sampled_token_ids.view(rows, repeats).long()
    counts = torch.zeros(rows, vocab, dtype=torch.long).scatter_add_(
        1, sampled, torch.ones_like(sampled)
    )
    assert out.logprobs_tensors is not None
    processed = out.logprobs_tensors.logprobs.view(rows, repeats, vocab)[:, 0]
    json.dump(
        {
            "counts": counts.tolist(),
            "processed": [
                [v if math.isfinite(v) else None for v in row] for row in processed.tolist()
            ],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()

"""Measure the trainer's ratio under each sampling configuration against a running vLLM.

    python -m tito_agents.trainer_check.sampling_run --base-url http://127.0.0.1:8794/v1 \\
        --model-dir ~/.cache/tito-agents/models/SmolLM2-135M-Instruct --out sampling.json

For each configuration (baseline T=1, T=0.7, top_p 0.8, top_k 20, min_p 0.1, T=0.7 + top_p 0.9;
`--config NAME` picks some) it sends `--calls` free-text chat calls of `--max-tokens` tokens through a
collector, declares the server's logprobs mode on the spans (probed unless `--logprobs-mode` says
it: vLLM's mode is server-wide and not readable from the API, see `tito_agents.sampling`), then
scores the samples with the served weights in fp32 (`behaviour_ratios.behaviour_figures`): naive and
behaviour-corrected mean |log ratio| and share outside [0.8, 1.2]. It prints one Markdown table row
per configuration (docs/trainer-check.md, "Sampling: temperature and truncation") and writes
every figure to `--out`. Run it once per server logprobs mode (`--logprobs-mode` is a server flag).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tito_agents.sampling import declare_sampling, probe_logprobs_mode
from tito_agents.trainer_check.behaviour_ratios import BehaviourFigures, behaviour_figures
from tito_agents.trainer_check.model import load_policy

CONFIGS: dict[str, dict[str, float | int]] = {
    "T=1": {},
    "T=0.7": {"temperature": 0.7},
    "top_p 0.8": {"top_p": 0.8},
    "top_k 20": {"top_k": 20},
    "min_p 0.1": {"min_p": 0.1},
    "T=0.7 + top_p 0.9": {"temperature": 0.7, "top_p": 0.9},
}

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Describe your favourite season and why.",
    "Explain how a bicycle works to a child.",
    "List some things to pack for a weekend trip.",
    "Tell me about the history of tea.",
    "What makes a good friend?",
    "Describe a busy market in the morning.",
    "Give advice to someone learning to cook.",
)


def collect(
    base_url: str, model: str, params: dict[str, Any], calls: int, max_tokens: int
) -> list[Any]:
    """`calls` free-text chat calls sampled with `params`, captured with logprobs, as samples."""
    import openai

    import tito_agents as tito

    with tempfile.TemporaryDirectory() as tmp:
        collector = tito.Collector(Path(tmp) / "samples.jsonl", capture_logprobs=True)
        client = collector.wrap(openai.OpenAI(base_url=base_url, api_key="EMPTY", timeout=600))
        samples: list[Any] = []
        for i in range(calls):
            with collector.episode(task_id=f"prompt-{i}") as ep:
                client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                    max_tokens=max_tokens,
                    seed=i,
                    extra_body=dict(params),
                )
            samples += ep.samples
        collector.close()
    return samples


def row(name: str, mode: str | None, figures: BehaviourFigures) -> str:
    """One Markdown table row: mean |log ratio| and share outside the clip range, both ratios."""

    def cell(stats: Any) -> str:
        return f"{stats.mean_abs:.4f} / {100 * stats.outside_fraction:.1f}%"

    return (
        f"| {name} | {mode or 'unknown'} | {cell(figures.naive)} | {cell(figures.corrected)} | "
        f"{figures.naive.tokens} | {figures.outside} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--model-dir", type=Path, required=True, help="the served weights")
    parser.add_argument("--config", action="append", choices=list(CONFIGS), default=None)
    for flag, kind in (("--temperature", float), ("--top-p", float), ("--top-k", int)):
        parser.add_argument(flag, type=kind, default=None, help="a configuration of your own")
    parser.add_argument("--min-p", type=float, default=None, help="a configuration of your own")
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--logprobs-mode", default=None, help="default: probe the server")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    base_url = args.base_url.rstrip("/")
    model = args.model or httpx.get(f"{base_url}/models", timeout=60).json()["data"][0]["id"]
    mode = args.logprobs_mode or probe_logprobs_mode(base_url, model, timeout=120)
    print(f"server {base_url} ({model}), logprobs mode {mode}", file=sys.stderr)
    policy = load_policy(args.model_dir.expanduser(), "fp32")
    results: dict[str, Any] = {"model": model, "logprobs_mode": mode, "configs": {}}
    print(
        "| sampling | logprobs mode | naive: mean / outside | corrected: mean / outside "
        "| tokens | outside support |"
    )
    print("|---|---|---|---|---|---|")
    own = {
        key: value
        for key, value in (
            ("temperature", args.temperature),
            ("top_p", args.top_p),
            ("top_k", args.top_k),
            ("min_p", args.min_p),
        )
        if value is not None
    }
    configs = {name: CONFIGS[name] for name in args.config or ([] if own else list(CONFIGS))}
    if own:
        configs[" ".join(f"{k} {v:g}" for k, v in own.items())] = own
    for name, params in configs.items():
        started = time.monotonic()
        samples = collect(base_url, model, params, args.calls, args.max_tokens)
        for sample in samples:
            declare_sampling(sample.spans, logprobs_mode=mode)
        figures = behaviour_figures(policy, samples)
        results["configs"][name] = {"params": params, **figures.to_dict()}
        print(row(name, mode, figures), flush=True)
        print(f"  ({name}: {time.monotonic() - started:.0f} s)", file=sys.stderr)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

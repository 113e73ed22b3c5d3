"""Benchmark: tito's share of an RL loop step (capture, assembly, conversion) next to the step.

    python benchmarks/bench_rl_share.py            # report only, exit 0
    python benchmarks/bench_rl_share.py --check    # exit 1 when the target is missed

The target: tito's part of a `make rl-loop` step is at most 2% of the step's wall time.
Measured side by side in one run, on the loop's batch (4 episodes of the quickstart's tool task,
3 model calls each, as `examples/rl_loop.py` runs them):

* tito: `TrlRollout.run` (the episodes through a wrapped client, the merged assembly at each
  episode's end, the rows for TRL) against an in-process fake vLLM that answers at once;
* plain: the same agent on the same fake through an unwrapped client, then nothing;
* the trainer's part of a step: one forward and backward pass of SmolLM2-135M (fp32, as TRL trains
  it on this machine) over the rows tito produced.

tito's cost is `tito - plain` (medians of the repeats); the share is that cost over
`train + plain`. The denominator leaves out the real engine's generation and the weight update
(seconds per step on the real loop), so the share here is an upper bound of the loop's. Needs the
converted model (`python3 scripts/vllm_server.py prepare`); without it the benchmark says so and
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import openai

import tito_agents as tito
from tito_agents.rl import TrlRollout
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLM, RequestView, mock_transport
from tito_agents.testing.smollm2 import MODEL_NAME

TARGET_SHARE = 0.02
EPISODES = 4
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def responder(view: RequestView) -> str:
    """A tool call, then (after the tool's answer) a sentence: the quickstart's task shape."""
    if (view.messages or [{}])[-1].get("role") == "tool":
        return "It is sunny in Paris today, 18 degrees, with a light wind from the west."
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


async def agent(prompt: Any, client: openai.AsyncOpenAI) -> float:
    messages: Any = [{"role": "user", "content": str(prompt)}]
    for _ in range(3):
        reply = await client.chat.completions.create(
            model=MODEL_NAME, messages=messages, tools=TOOLS, max_tokens=64
        )
        message = reply.choices[0].message
        messages.append(
            message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        )
        if not message.tool_calls:
            return 1.0 if "sunny" in (message.content or "") else 0.0
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C, sunny"})
    return 0.0


def client_for(fake: FakeVLLM) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://vllm.test/v1",
        api_key="x",
        http_client=openai.DefaultAsyncHttpxClient(transport=mock_transport(fake)),
    )


def time_plain(fake: FakeVLLM, prompts: list[str]) -> float:
    async def run() -> float:
        client = client_for(fake)
        started = time.perf_counter()
        await asyncio.gather(*(agent(p, client) for p in prompts))
        elapsed = time.perf_counter() - started
        await client.close()
        return elapsed

    return asyncio.run(run())


def model_dir() -> Path | None:
    root = Path(os.environ.get("TITO_CACHE_DIR") or Path.home() / ".cache" / "tito-agents")
    folder = root / "models" / "SmolLM2-135M-Instruct"
    return folder if (folder / "config.json").exists() else None


def time_train(folder: Path, rows: dict[str, list[Any]]) -> float:
    """One forward + backward of the policy over the rows (prompt + completion ids), fp32."""
    import torch

    from tito_agents.trainer_check.model import load_policy

    model = load_policy(folder, "fp32")
    model.train()
    sequences = [p + c for p, c in zip(rows["prompt_ids"], rows["completion_ids"], strict=True)]
    width = max(len(s) for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
    model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1).mean().backward()
    model.zero_grad()
    started = time.perf_counter()
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logits.log_softmax(-1).mean().backward()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    fake = FakeVLLM(FakeConfig(responder=responder))
    prompts = ["What is the weather in Paris?"] * EPISODES
    collector = tito.Collector(capture_logprobs=True, assembly="merged")
    rollout = TrlRollout(agent, collector, collector.wrap(client_for(fake)))
    plain_s, tito_s, convert_s = [], [], []
    rows: dict[str, list[Any]] = {}
    for _ in range(args.repeats + 1):  # the first round of each warms up
        plain_s.append(time_plain(fake, prompts))
        started = time.perf_counter()
        rows = rollout.run(prompts, EPISODES)
        tito_s.append(time.perf_counter() - started)
        convert_s.append(rollout.last_timings.convert_s)
    rollout.close(client=True)
    plain, with_tito = statistics.median(plain_s[1:]), statistics.median(tito_s[1:])
    convert = statistics.median(convert_s[1:])
    # what tito adds: the difference of the two runs, and never less than the conversion alone
    # (measured inside the tito run), so noise between the runs cannot hide it
    cost = max(with_tito - plain, convert)
    figures: dict[str, Any] = {
        "episodes": EPISODES,
        "rows": len(rows["prompt_ids"]),
        "plain_rollout_s": round(plain, 4),
        "tito_rollout_s": round(with_tito, 4),
        "convert_s": round(convert, 5),
        "tito_cost_s": round(cost, 4),
        "load": round(os.getloadavg()[0], 2),
    }
    folder = model_dir()
    if folder is None:
        figures["train_s"] = None
        print(json.dumps(figures, indent=2))
        print(
            "SKIP: no converted SmolLM2 (python3 scripts/vllm_server.py prepare); share not computed"
        )
        return 0
    train = time_train(folder, rows)
    share = cost / (train + plain)
    figures.update(train_s=round(train, 3), share=round(share, 4), target=TARGET_SHARE)
    print(json.dumps(figures, indent=2))
    ok = share <= TARGET_SHARE
    print(f"{'PASS' if ok else 'FAIL'}: tito's share of a step {100 * share:.4f}% (target <= 2%)")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())

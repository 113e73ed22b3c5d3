"""Quickstart: a small tool-using agent, several episodes at once, exact samples in a file.

    python examples/quickstart.py --base-url http://127.0.0.1:8765/v1 --episodes 8 --out samples.jsonl
    python examples/quickstart.py --temperature 0.7 --top-p 0.9   # sampled otherwise

The agent is plain openai code. tito-agents adds two lines: `collector.wrap(client)` and the
`async with collector.episode(...)` around each rollout. At the end the script prints a summary,
checks how many calls would have drifted had their sampled text been re-tokenized, and re-scores
every trained token on the server to show the samples' policy logprobs are what a trainer gets.

The first call of each episode forces a tool call (`tool_choice="required"`): vLLM samples it
through a grammar mask, and its logprobs are those of the masked distribution. The collector is
asked to re-score such calls (`rescore_constrained=True`), so `Sample.policy_logprobs` holds the
policy's own logprobs there; the summary prints how far apart the two are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

import tito_agents as tito
from tito_agents.sampling import probe_logprobs_mode

WEATHER = {
    "Paris": "18C and sunny",
    "Tokyo": "22C and cloudy",
    "Oslo": "3C and snowing",
    "Lima": "25C and clear",
    "Cairo": "31C and dry",
    "Quito": "14C and rainy",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name"}},
                "required": ["city"],
                "additionalProperties": False,
            },
            # strict: with a forced tool choice vLLM then constrains the arguments to the schema
            "strict": True,
        },
    }
]


def get_weather(city: str) -> str:
    return WEATHER.get(city.strip().title(), "unknown")


async def run_episode(
    client: openai.AsyncOpenAI,
    collector: tito.Collector,
    model: str,
    city: str,
    index: int,
    sampling: dict[str, float | int] | None = None,
) -> tito.Episode:
    """One rollout: ask, let the model call the tool, answer; rewarded for the right tool call
    and for an answer that uses the tool's result. `sampling` (temperature, top_p, top_k, min_p)
    applies to both calls; every span records it (`CallSpan.sampling`)."""
    sampling = {"temperature": 1.0, **(sampling or {})}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Use tools when useful."},
        {"role": "user", "content": f"What is the weather in {city} right now?"},
    ]
    async with collector.episode(task_id=f"weather-{city}", group_id=city) as ep:
        first = await client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=64,
            seed=index,
            extra_body=sampling,
        )
        message = first.choices[0].message
        observation = "unknown"
        messages.append(
            message.model_dump(
                exclude_none=True,
                exclude={"refusal", "annotations", "audio", "function_call", "reasoning"},
            )
        )
        for tool_call in message.tool_calls or []:
            try:
                observation = get_weather(json.loads(tool_call.function.arguments).get("city", ""))
            except (json.JSONDecodeError, AttributeError):
                observation = "error: bad arguments"
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": observation})
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=48,
            seed=index,
            stream=True,
            extra_body=sampling,
        )
        answer = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        # 0.5 for asking the tool about the right city, 0.5 for an answer that uses its result
        asked_right_city = observation == WEATHER[city]
        used_result = any(w.lower() in answer.lower() for w in WEATHER[city].split()[::2])
        ep.set_reward(0.5 * asked_right_city + 0.5 * used_result)
    return ep


async def count_drift(base_url: str, samples: list[tito.Sample]) -> tuple[int, int]:
    """Decode each call's sampled ids and encode the text again (with the server's own tokenizer,
    /detokenize and /tokenize): how many calls would have come back with other ids?"""
    root = base_url.rstrip("/").removesuffix("/v1")
    drifted = 0
    async with httpx.AsyncClient(base_url=root, timeout=60) as http:
        for sample in samples:
            for span in sample.spans:
                ids = sample.token_ids[span.start : span.end].tolist()
                text = (await http.post("/detokenize", json={"tokens": ids})).json()["prompt"]
                again = (
                    await http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
                ).json()
                drifted += again["tokens"] != ids
    return drifted, sum(len(s.spans) for s in samples)


async def score_trained(base_url: str, model: str, samples: list[tito.Sample]) -> list[float]:
    """|stored - re-scored| on every trained token: each sample's ids re-scored by the server
    (`/v1/completions`, token prompt, `prompt_logprobs=0`), an independent check of the logprobs a
    trainer would take as the old policy's (`Sample.ratio_logprobs`)."""
    gaps: list[float] = []
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=600) as http:
        for sample in samples:
            stored = sample.ratio_logprobs()
            if stored is None:
                continue
            body = {
                "model": model,
                "prompt": sample.token_ids.tolist(),
                "max_tokens": 1,
                "prompt_logprobs": 0,
            }
            entries = (await http.post("/completions", json=body)).json()["choices"][0][
                "prompt_logprobs"
            ]
            for i in sample.loss_mask.nonzero()[0].tolist():
                token = str(int(sample.token_ids[i]))
                gaps.append(abs(float(stored[i]) - entries[i][token]["logprob"]))
    return gaps


def constrained_gaps(samples: list[tito.Sample]) -> list[float]:
    """|rollout - policy| logprob on trained tokens sampled under a constraint."""
    gaps: list[float] = []
    for sample in samples:
        if sample.logprobs is None or sample.policy_logprobs is None:
            continue
        mask = sample.constrained_mask().astype(bool)
        gaps.extend(abs(sample.logprobs[mask] - sample.policy_logprobs[mask]).tolist())
    return gaps


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765/v1")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("samples.jsonl"))
    parser.add_argument("--temperature", type=float, default=None, help="default 1.0")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus truncation (off: 1)")
    parser.add_argument("--top-k", type=int, default=None, help="top-k truncation (off: 0)")
    parser.add_argument("--min-p", type=float, default=None, help="min-p truncation (off: 0)")
    args = parser.parse_args()
    sampling = {
        key: value
        for key, value in (
            ("temperature", args.temperature),
            ("top_p", args.top_p),
            ("top_k", args.top_k),
            ("min_p", args.min_p),
        )
        if value is not None
    }

    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="EMPTY", timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    args.out.unlink(missing_ok=True)
    collector = tito.Collector(args.out, capture_logprobs=True, rescore_constrained=True)
    collector.wrap(client)  # <- tito-agents, line 1

    cities = list(WEATHER)
    gate = asyncio.Semaphore(args.concurrency)
    done = 0
    started = time.time()

    async def one(i: int) -> tito.Episode:
        nonlocal done
        async with gate:
            ep = await run_episode(client, collector, model, cities[i % len(cities)], i, sampling)
        done += 1
        print(
            f"\r  episodes {done}/{args.episodes}  ({time.time() - started:.0f}s)",
            end="",
            file=sys.stderr,
            flush=True,
        )
        return ep

    print(f"running {args.episodes} episodes against {args.base_url} ({model})", file=sys.stderr)
    episodes = await asyncio.gather(*(one(i) for i in range(args.episodes)))
    print(file=sys.stderr)
    collector.close()

    samples = list(tito.read_samples(args.out))
    drifted, calls = await count_drift(args.base_url, samples)
    stats = collector.stats
    rewards = [ep.reward or 0.0 for ep in episodes]
    print("\n== tito-agents quickstart ==")
    print(f"episodes        {len(episodes)}  (mean reward {sum(rewards) / len(rewards):.2f})")
    print(
        f"calls           {stats.complete_calls} complete, {stats.unusable_calls} unusable, "
        f"{stats.incomplete_calls} incomplete"
    )
    print(f"samples         {len(samples)}")
    print(f"tokens          {sum(s.num_tokens for s in samples)}")
    print(f"trained tokens  {sum(s.num_trained for s in samples)}")
    print(f"file            {args.out.resolve()}")
    print(
        f"drift           {drifted} of {calls} calls would have come back with other token ids "
        "had their text been re-tokenized"
    )
    constrained = sum(int(s.constrained_mask().sum()) for s in samples)
    gaps = constrained_gaps(samples)
    gap_text = (
        f"mean |rollout - policy| logprob {sum(gaps) / len(gaps):.3f} nats (max {max(gaps):.2f})"
        if gaps
        else "none re-scored"
    )
    print(
        f"constrained     {constrained} trained tokens sampled under a constraint "
        f"({stats.constrained_calls} calls, {stats.rescored_calls} re-scored); {gap_text}"
    )
    spans = [span for s in samples for span in s.spans]
    truncated = sum(span.truncated for span in spans)
    mode = await asyncio.to_thread(probe_logprobs_mode, args.base_url, model, timeout=120)
    print(
        f"sampling        {json.dumps(sampling or {'temperature': 1.0})}: {truncated} of "
        f"{len(spans)} spans truncated; server logprobs mode (probed) {mode}"
        + (
            " -- a trainer must use behaviour logprobs (docs/trainer-check.md)"
            if truncated or sampling.get("temperature", 1.0) != 1.0
            else ""
        )
    )
    checked = await score_trained(args.base_url, model, samples)
    if checked:
        print(
            f"policy check    {len(checked)} trained tokens re-scored by the server: "
            f"mean |stored - re-scored| {sum(checked) / len(checked):.4f}, "
            f"max {max(checked):.3f} (the logprobs a trainer takes as the old policy's)"
        )
    await client.close()
    return 0 if samples else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

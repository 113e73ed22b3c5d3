"""One RL iteration on a real CPU vLLM: collect -> convert -> step -> reload -> collect.

    python examples/rl_step.py --base-url http://127.0.0.1:8765/v1      # or: make rl-step

1. Round 1: a small tool-using agent (the quickstart's weather task, groups of rollouts per city)
   runs against the served SmolLM2; tito-agents captures the sampled ids and rollout logprobs.
2. The trainer's view: the served weights loaded into transformers score the samples through every
   converter layout (`tito_agents.trainer_check`), beside a text pipeline's rebuild of the same
   episodes, and the script prints the two lines that matter.
3. One GRPO step (clipped surrogate on `pack_batch` + `group_advantages`, AdamW) updates the
   weights, which are saved as bf16 safetensors and served: reloaded in place when the server
   runs in vLLM's dev mode (`tito_agents.rl.VllmWeights`, seconds; the original weights are put
   back after round 2), else by a second vLLM (port 8776, started and stopped here with
   `TITO_VLLM_MODEL_DIR`; 1-2 minutes).
4. Round 2 runs against the updated server with the collector's `policy_version` moved on; its
   samples must carry the new version and be exact against the new weights.

Writes the comparison (JSON) for `tito-agents compare` (`--html` gives the plot).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import openai

import tito_agents as tito
from tito_agents.trainer_check import (
    Comparison,
    PipelineFigures,
    compare,
    constrained_calls,
    grpo_step,
    load_policy,
    load_tokenizer,
    masked_rollout,
    save_policy,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from quickstart import TOOLS, WEATHER, get_weather  # noqa: E402

RELOAD_PORT = 8776


def _say(message: str) -> None:
    print(f"[rl-step] {message}", file=sys.stderr, flush=True)


def load_server_script() -> ModuleType:
    """scripts/vllm_server.py, imported by path."""
    spec = importlib.util.spec_from_file_location(
        "tito_vllm_server_rl", ROOT / "scripts/vllm_server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def episode(
    client: openai.AsyncOpenAI,
    collector: tito.Collector,
    model: str,
    city: str,
    seed: int,
    max_tokens: tuple[int, int],
) -> tito.Episode:
    """Ask for the weather: a forced tool call (constrained), the tool, a free-running answer.
    Reward: 0.5 for the right city, 0.5 for an answer that uses the tool's result."""
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
            max_tokens=max_tokens[0],
            temperature=1.0,
            seed=seed,
        )
        message = first.choices[0].message
        messages.append(
            message.model_dump(
                exclude_none=True,
                exclude={"refusal", "annotations", "audio", "function_call", "reasoning"},
            )
        )
        observation = "unknown"
        for call in message.tool_calls or []:
            try:
                observation = get_weather(json.loads(call.function.arguments).get("city", ""))
            except (json.JSONDecodeError, AttributeError):
                observation = "error: bad arguments"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
        second = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens[1],
            temperature=1.0,
            seed=seed,
        )
        answer = second.choices[0].message.content or ""
        used = any(w.lower() in answer.lower() for w in WEATHER[city].split()[::2])
        ep.set_reward(0.5 * (observation == WEATHER[city]) + 0.5 * used)
    return ep


@dataclass
class Round:
    """One round of episodes: the samples and the calls they came from, by call id."""

    samples: list[tito.Sample]
    calls: dict[str, tito.Call]
    rewards: list[float]
    seconds: float
    policy_version: str | None


async def collect(
    base_url: str,
    *,
    episodes: int,
    cities: int,
    max_tokens: tuple[int, int],
    policy_version: str,
    concurrency: int = 4,
    seed: int = 0,
) -> Round:
    """`episodes` rollouts (`episodes / cities` per GRPO group), merged samples kept in memory."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=900)
    model = (await client.models.list()).data[0].id
    # Re-score the forced tool calls (their rollout logprobs are the grammar-masked distribution's)
    # where this version of the collector can.
    rescore = "rescore_constrained" in inspect.signature(tito.Collector).parameters
    collector = tito.Collector(
        None,
        capture_logprobs=True,
        assembly="merged",
        policy_version=policy_version,
        **({"rescore_constrained": True} if rescore else {}),
    )
    collector.wrap(client)
    names = list(WEATHER)[:cities]
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()

    async def one(i: int) -> tito.Episode:
        async with gate:
            return await episode(
                client, collector, model, names[i % len(names)], seed + i, max_tokens
            )

    eps = await asyncio.gather(*(one(i) for i in range(episodes)))
    collector.close()
    await client.close()
    samples = list(collector.sink.samples)
    return Round(
        samples=samples,
        calls={c.call_id: c for ep in eps for c in ep.calls},
        rewards=[ep.reward or 0.0 for ep in eps],
        seconds=time.monotonic() - started,
        policy_version=policy_version,
    )


@contextmanager
def served(weights: Path, port: int) -> Iterator[str]:
    """A vLLM of our own serving `weights` on `port` (restarted if one runs there), stopped after."""
    script = load_server_script()
    saved = {k: os.environ.get(k) for k in ("TITO_VLLM_PORT", "TITO_VLLM_MODEL_DIR")}
    os.environ["TITO_VLLM_PORT"] = str(port)
    os.environ["TITO_VLLM_MODEL_DIR"] = str(weights)
    try:
        script.stop()
        url = str(script.start())
        yield url
    finally:
        script.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _round2(
    base_url: str,
    model_dir: Path,
    new_dir: Path,
    reload_port: int | None,
    step: dict[str, Any],
    **collect_kw: Any,
) -> Round:
    """Round 2 on the new weights: reloaded in place into the dev-mode server at `base_url`
    (`reload_port` None; the original weights go back after), else on a second server."""
    from tito_agents.rl import VllmWeights

    if reload_port is None:
        weights = VllmWeights(base_url)
        update = weights.update(new_dir, "1")
        step["reload_s"] = update.seconds
        step["reload"] = "in-place"
        _say(f"reload: {new_dir} served in place in {update.seconds:.2f} s (version 1)")
        try:
            return asyncio.run(collect(base_url, policy_version="1", seed=1000, **collect_kw))
        finally:
            weights.update(model_dir, "0")
    _say(f"reload: vLLM on port {reload_port} serving {new_dir}")
    started = time.monotonic()
    with served(new_dir, reload_port) as url:
        step["reload_s"] = time.monotonic() - started
        step["reload"] = "restart"
        return asyncio.run(collect(url, policy_version="1", seed=1000, **collect_kw))


@dataclass
class LoopResult:
    """Everything one iteration measured."""

    comparison: Comparison
    round1: Round
    round2: Round | None = None
    round2_check: PipelineFigures | None = None
    step: dict[str, Any] = field(default_factory=dict)


def run_loop(
    base_url: str,
    model_dir: Path,
    out_dir: Path,
    *,
    episodes: int = 6,
    cities: int = 2,
    max_tokens: tuple[int, int] = (48, 32),
    dtypes: Sequence[str] = ("fp32", "bf16"),
    text_dtypes: Sequence[str] | None = None,
    lr: float = 1e-4,
    reload_port: int = RELOAD_PORT,
    second_round: bool = True,
    reload_in_place: bool = False,
) -> LoopResult:
    """collect -> compare -> step -> reload -> collect; see the module docstring."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    _say(f"round 1: {episodes} episodes against {base_url}")
    round1 = asyncio.run(
        collect(
            base_url,
            episodes=episodes,
            cities=cities,
            max_tokens=max_tokens,
            policy_version="0",
        )
    )
    samples, calls = round1.samples, round1.calls
    _say(f"round 1: {len(samples)} samples in {round1.seconds:.0f} s; scoring {list(dtypes)}")
    comparison = compare(
        samples,
        calls,
        model_dir,
        dtypes=dtypes,
        other_layouts=("pack",),  # bf16 on CPU is slow; the layouts agree in fp32
        text_dtypes=text_dtypes,
        progress=_say,
    )
    result = LoopResult(comparison=comparison, round1=round1)

    _say("GRPO step")
    policy = load_policy(model_dir, "fp32")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)
    forced = constrained_calls(samples, calls)
    step = grpo_step(policy, optimizer, samples, [masked_rollout(s, forced) for s in samples])
    new_dir = save_policy(policy, load_tokenizer(model_dir), model_dir, out_dir / "policy-1")
    del policy, optimizer
    result.step = step.to_dict() | {"lr": lr, "weights": str(new_dir)}
    comparison.extra["step"] = result.step
    comparison.extra["round1"] = {"rewards": round1.rewards, "policy_version": "0"}

    if second_round:
        round2 = _round2(
            base_url,
            model_dir,
            new_dir,
            reload_port if not reload_in_place else None,
            result.step,
            episodes=max(2, episodes // 2),
            cities=cities,
            max_tokens=max_tokens,
        )
        check = compare(
            round2.samples,
            round2.calls,
            new_dir,
            dtypes=("fp32",),
            layouts=("pack",),
            text_dtypes=(),
        )
        # The same samples against the weights before the step: the reload took effect when the
        # new weights explain them better than the old ones.
        before = compare(
            round2.samples,
            round2.calls,
            model_dir,
            dtypes=("fp32",),
            layouts=("pack",),
            text_dtypes=(),
        )
        versions = sorted({str(s.policy_version) for smp in round2.samples for s in smp.spans})
        figures = check.tito["fp32"]["pack"]
        result.round2, result.round2_check = round2, figures
        comparison.extra["round2"] = {
            "samples": len(round2.samples),
            "policy_versions": versions,
            "rewards": round2.rewards,
            "fp32_pack": figures.to_dict(),
            "fp32_pack_old_weights": before.tito["fp32"]["pack"].to_dict(),
        }
    (out_dir / "comparison.json").write_text(json.dumps(comparison.to_dict()))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    port = os.environ.get("TITO_VLLM_PORT") or "8765"
    parser.add_argument("--base-url", default=f"http://127.0.0.1:{port}/v1")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the weights the server serves (default: the folder scripts/vllm_server.py made)",
    )
    parser.add_argument("--out", type=Path, default=Path("out/rl-step"))
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--cities", type=int, default=2, help="GRPO groups")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--reload-port", type=int, default=RELOAD_PORT)
    parser.add_argument("--no-reload", action="store_true", help="stop after the step")
    parser.add_argument(
        "--reload",
        choices=("auto", "in-place", "restart"),
        default="auto",
        help="serve the new weights in place (dev-mode server) or on a second vLLM "
        "(auto: in place when the server has the dev-mode weight routes)",
    )
    args = parser.parse_args(argv)
    model_dir = args.model_dir or Path(load_server_script().model_dir())
    in_place = args.reload == "in-place"
    if args.reload == "auto":
        from tito_agents.rl import VllmWeights, WeightSyncError

        try:
            VllmWeights(args.base_url, timeout=10).version()
            in_place = True
        except WeightSyncError:
            in_place = False
    started = time.monotonic()
    result = run_loop(
        args.base_url,
        model_dir,
        args.out,
        episodes=args.episodes,
        cities=args.cities,
        dtypes=tuple(d for d in args.dtypes.split(",") if d),
        text_dtypes=("fp32",),
        lr=args.lr,
        reload_port=args.reload_port,
        second_round=not args.no_reload,
        reload_in_place=in_place,
    )
    comparison = result.comparison
    print("\n== tito-agents: one RL step, trainer's view ==")
    for dtype, layouts in comparison.tito.items():
        for layout, figures in layouts.items():
            print(f"  tito {dtype:4} {layout:9}  free: {figures.free.line()}")
        for figures in list(layouts.values())[:1]:
            print(
                f"  tito {dtype:4} constrained tokens (masked rollout logprobs, not a ratio "
                f"a loss should use): {figures.constrained.line()}"
            )
            if figures.constrained_policy is not None:
                print(
                    f"  tito {dtype:4} constrained tokens against the re-scored policy logprobs "
                    f"(what the loss uses): {figures.constrained_policy.line()}"
                )
    step = result.step
    print(
        f"  step: loss {step['loss']:.4f} on {step['tokens']} tokens, advantages "
        f"{[round(a, 2) for a in step['advantages']]}, {100 * step['changed_bf16']:.1f}% of bf16 "
        "weights changed"
    )
    if result.round2 is not None and result.round2_check is not None:
        print(
            f"  round 2 (policy_version {comparison.extra['round2']['policy_versions']}): "
            f"{len(result.round2.samples)} samples, against the updated weights: "
            f"{result.round2_check.free.line()}; {result.round2_check.differing} trained tokens "
            "differ from the sampled ids"
        )
        old = comparison.extra["round2"]["fp32_pack_old_weights"]["free"]
        print(
            f"  round 2 against the weights before the step: mean |log ratio| "
            f"{old['mean_abs']:.4f} (the server did serve the new weights when this is larger)"
        )
    print(
        f"  comparison: {args.out / 'comparison.json'} (plot: tito-agents compare "
        f"{args.out / 'comparison.json'} --html {args.out / 'comparison.html'})"
    )
    print(f"  {time.monotonic() - started:.0f} s in all\n")
    for line in comparison.headline():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

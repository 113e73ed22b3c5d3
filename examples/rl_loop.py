"""RL_STEPS GRPO steps with TRL's GRPOTrainer on a running dev-mode vLLM, twice from the same
weights and seeds: on tito samples, then on the same agent's rows rebuilt by a text pipeline.

    python examples/rl_loop.py --base-url http://127.0.0.1:8777/v1 --steps 20   # or make rl-loop

The server must run in vLLM's dev mode (`VLLM_SERVER_DEV_MODE=1`): after each optimizer step the
trainer's weights are reloaded into it in place (`tito_agents.rl.attach_engine`, 1-3 s), and
before the second pipeline it is reset to the initial weights the same way (no restart).

Each step: one prompt of the quickstart's weather task x `--generations` episodes (a forced tool
call, the tool, a free answer; reward 0.5 for the right city + 0.5 for using the tool's answer)
through `TrlRollout`. The "tito" pipeline trains on the engine's ids and logprobs; the "text"
pipeline on what a text collector would build from the same episodes
(`trainer_check.text_pipeline`: decoded text, re-rendered and re-tokenized, logprobs aligned by
byte offset). TRL's importance-sampling correction is on in both, so the log ratio trainer vs.
rollout is the one its loss uses.

Writes out/rl-loop/loop.json (one row per step and pipeline), loop.html and loop.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import openai

import tito_agents as tito
from tito_agents.rl import TrlRollout, VllmWeights, passthrough_reward
from tito_agents.rl.loop_plot import render_loop_html, to_png
from tito_agents.rl.trl_engine import RatioProbe, attach_engine
from tito_agents.rl.versions import VersionLog

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from quickstart import TOOLS, WEATHER, get_weather  # noqa: E402

SYSTEM = "You are a helpful assistant. Use tools when useful."


def _say(message: str) -> None:
    print(f"[rl-loop] {message}", file=sys.stderr, flush=True)


def make_agent(model: str, max_tokens: tuple[int, int], seeds: dict[str, int]) -> Any:
    """The weather agent: `async def agent(city, client) -> reward`, seeded per step and entry
    so both pipelines sample the same first step."""

    async def agent(city: str, client: Any) -> float:
        ep = tito.current_episode()
        index = int(ep.metadata.get("prompt_index", 0)) if ep is not None else 0
        seed = seeds["batch"] * 1000 + index * 10
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is the weather in {city} right now?"},
        ]
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
            message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
        )
        observation = "unknown"
        for call in message.tool_calls or []:
            try:
                observation = get_weather(json.loads(call.function.arguments).get("city", ""))
            except (json.JSONDecodeError, AttributeError):
                observation = "error: bad arguments"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
        if not message.tool_calls:
            return 0.0
        second = await client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            max_tokens=max_tokens[1],
            temperature=1.0,
            seed=seed + 1,
        )
        answer = second.choices[0].message.content or ""
        used = any(w.lower() in answer.lower() for w in WEATHER[city].split()[::2])
        return 0.5 * (observation == WEATHER[city]) + 0.5 * used

    return agent


def differing_tito(samples: Sequence[tito.Sample], calls: dict[str, tito.Call]) -> int:
    """Trained tokens of tito's rows that are not the ids the engine sampled at that place."""
    out = 0
    for sample in samples:
        for span in sample.spans:
            sampled = calls[span.call_id].sampled_ids.tolist()
            trained = sample.token_ids[span.start : span.end].tolist()
            out += sum(a != b for a, b in zip(trained, sampled, strict=False))
            out += abs(len(trained) - len(sampled))
    return out


class TextRows:
    """`TrlRollout(rows=...)`: the episodes' rows as the text pipeline rebuilds them."""

    def __init__(self, tokenizer: Any) -> None:
        from tito_agents.trainer_check.side_by_side import SERVED_TEMPLATE_PATH

        self.tokenizer = tokenizer
        self.template = SERVED_TEMPLATE_PATH.read_text()
        self.differing = self.trained = 0

    def __call__(
        self, samples: list[tito.Sample], episodes: list[tito.Episode], _n: int
    ) -> dict[str, list[Any]]:
        from tito_agents.trainer_check import constrained_calls
        from tito_agents.trainer_check.side_by_side import text_rows

        calls = {c.call_id: c for ep in episodes for c in ep.calls}
        forced = constrained_calls(samples, calls)
        rows = text_rows(
            samples, calls, self.tokenizer, chat_template=self.template, constrained=forced
        )
        out: dict[str, list[Any]] = {
            k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")
        }
        self.differing = self.trained = 0
        for row in rows:
            first = int(row.trained[0])
            ids = row.input_ids.tolist()
            n = len(ids) - first
            mask, lps = [0] * n, [0.0] * n
            for pos, lp, forced_token in zip(
                row.trained.tolist(), row.rollout.tolist(), row.constrained.tolist(), strict=True
            ):
                mask[pos - first] = 1
                # as tito does: no ratio on the grammar-masked logprobs of a forced call
                lps[pos - first] = None if forced_token else lp  # type: ignore[call-overload]
            out["prompt_ids"].append(ids[:first])
            out["completion_ids"].append(ids[first:])
            out["logprobs"].append(lps)
            out["env_mask"].append(mask)
            self.differing += int((~row.matches).sum())
            self.trained += len(row.trained)
        out["reward"] = [s.reward for s in samples]
        return out


def run_pipeline(
    name: str, args: argparse.Namespace, model_dir: Path, model: str
) -> list[dict[str, Any]]:
    """`args.steps` GRPO steps of one pipeline from the initial weights; one row per step."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from tito_agents.trainer_check import load_policy, load_tokenizer

    reset = VllmWeights(args.base_url).update(model_dir, "0")
    _say(f"{name}: server reset to the initial weights in {reset.seconds:.2f} s (version 0)")
    torch.manual_seed(args.seed)
    versions = VersionLog(initial="0")
    # rescore_constrained: the forced tool calls' own policy logprobs (vLLM returns the grammar-
    # masked ones), so their tokens count in the ratio too; the text pipeline cannot have them
    collector = tito.Collector(
        None,
        capture_logprobs=True,
        assembly="merged",
        policy_version="0",
        rescore_constrained=args.rescore,
    )
    client = collector.wrap(
        openai.AsyncOpenAI(base_url=args.base_url, api_key="EMPTY", timeout=900), sessions=True
    )
    seeds = {"batch": 0}
    tokenizer = load_tokenizer(model_dir)
    text = TextRows(tokenizer) if name == "text" else None
    rollout = TrlRollout(
        make_agent(model, (args.max_tokens, args.answer_tokens), seeds),
        collector,
        client,
        versions=versions,
        rows=text,
        lag=args.lag,
        timeout=1800,
    )
    policy = load_policy(model_dir, "fp32")
    policy.train()
    cities = list(WEATHER)
    config = trl.GRPOConfig(
        output_dir=str(args.out / f"trainer-{name}"),
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        max_steps=args.steps,
        learning_rate=args.lr,
        beta=0.0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        mask_truncated_completions=False,
        seed=args.seed,
        shuffle_dataset=False,
    )
    trainer = trl.GRPOTrainer(
        model=policy,
        reward_funcs=passthrough_reward,
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict(
            {"prompt": [cities[i % len(cities)] for i in range(args.steps)]}
        ),
        rollout_func=rollout,
    )
    # the weights written each step (257 MB in bf16): in memory where /dev/shm exists, removed after
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    weights_dir = Path(tempfile.mkdtemp(prefix=f"tito-rl-loop-{name}-", dir=shm))
    engine = attach_engine(
        trainer, args.base_url, weights_dir, collector=collector, versions=versions
    )
    probe = RatioProbe(trainer)
    rows: list[dict[str, Any]] = []
    inner = rollout.run
    last = {"t": time.perf_counter(), "update": reset.seconds}

    def counted(prompts: Sequence[Any], n: int) -> dict[str, list[Any]]:
        seeds["batch"] += 1
        return inner(prompts, n)

    rollout.run = counted  # type: ignore[method-assign]
    engine.on_update = lambda u: last.__setitem__("update", u.seconds)

    class Rows(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, _args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            timings, batch = rollout.last_timings, probe.batches[-1]
            calls = {c.call_id: c for ep in rollout.last_episodes for c in ep.calls}
            rewards = [float(s.reward or 0.0) for s in rollout.last_samples]
            row = {
                "pipeline": name,
                "step": int(state.global_step),
                "policy_version": sorted({str(v) for v in timings.policy_versions}),
                "server_version": VllmWeights(args.base_url).version(),
                "reward_mean": statistics.fmean(rewards),
                "reward_std": statistics.pstdev(rewards),
                "mean_abs_log_ratio": batch.mean_abs,
                "max_abs_log_ratio": batch.max_abs,
                "frac_outside_clip": batch.frac_outside_clip,
                "rows_downweighted": batch.rows_downweighted,
                "is_weight_mean": batch.weight_mean,
                "ratio_tokens": batch.tokens,
                "differing_tokens": text.differing
                if text
                else differing_tito(rollout.last_samples, calls),
                "trained_tokens": text.trained
                if text
                else sum(s.num_trained for s in rollout.last_samples),
                "straddling_calls": timings.straddling_calls,
                "mislabelled_calls": timings.mislabelled_calls,
                "wait_s": timings.wait_s,
                "weight_update_s": last["update"],
                "rollout_s": timings.rollout_s,
                "convert_s": timings.convert_s,
                "generate_s": batch.seconds,
                "train_s": now - last["t"] - batch.seconds,
                "step_s": now - last["t"],
            }
            row["policy_version"] = ",".join(row["policy_version"])
            last["t"] = now
            rows.append(row)
            _say(
                f"{name} step {row['step']}/{args.steps}: v{row['policy_version']} "
                f"reward {row['reward_mean']:.3f} mean|log r| {row['mean_abs_log_ratio']:.4f} "
                f"outside clip {row['frac_outside_clip']:.3f} differing "
                f"{row['differing_tokens']}/{row['trained_tokens']} update "
                f"{row['weight_update_s']:.2f} s rollout {row['rollout_s']:.1f} s convert "
                f"{1000 * row['convert_s']:.1f} ms step {row['step_s']:.0f} s"
            )

    trainer.add_callback(Rows())
    try:
        trainer.train()
    finally:
        rollout.close(client=True)
        shutil.rmtree(weights_dir, ignore_errors=True)
        collector.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--base-url", default=f"http://127.0.0.1:{os.environ.get('TITO_VLLM_PORT', '8777')}/v1"
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the served weights (default: scripts/vllm_server.py's)",
    )
    parser.add_argument("--out", type=Path, default=Path("out/rl-loop"))
    parser.add_argument("--steps", type=int, default=int(os.environ.get("RL_STEPS") or 20))
    parser.add_argument(
        "--generations", type=int, default=4, help="episodes per step (one GRPO group)"
    )
    parser.add_argument("--max-tokens", type=int, default=40, help="of the tool call")
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pipelines", default="tito,text")
    parser.add_argument(
        "--lag",
        type=int,
        choices=(0, 1),
        default=0,
        help="1: async, rollouts of the next step run while this one trains (one step off-policy)",
    )
    parser.add_argument(
        "--no-rescore",
        dest="rescore",
        action="store_false",
        help="leave the forced tool calls out of tito's ratio instead of re-scoring them",
    )
    args = parser.parse_args(argv)
    if args.model_dir is None:
        spec = importlib.util.spec_from_file_location(
            "tito_vllm_rl", ROOT / "scripts/vllm_server.py"
        )
        assert spec is not None and spec.loader is not None
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        args.model_dir = Path(script.model_dir())
    args.out.mkdir(parents=True, exist_ok=True)
    model = openai.OpenAI(base_url=args.base_url, api_key="EMPTY").models.list().data[0].id
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in [p for p in args.pipelines.split(",") if p]:
        rows += run_pipeline(name, args, args.model_dir, model)
    VllmWeights(args.base_url).update(args.model_dir, "0")  # leave the server as it was
    data = {
        "rows": rows,
        "steps": args.steps,
        "generations": args.generations,
        "seconds": time.perf_counter() - started,
    }
    (args.out / "loop.json").write_text(json.dumps(data, indent=1))
    page = render_loop_html(data)
    (args.out / "loop.html").write_text(page, encoding="utf-8")
    png = to_png(page, args.out / "loop.png", height=420 + 19 * len(rows))
    _say(
        f"wrote {args.out / 'loop.json'}, loop.html"
        f"{', loop.png' if png else ' (no Chromium: no PNG)'} in {data['seconds']:.0f} s"
    )
    for name in ("tito", "text"):
        mine = [r for r in rows if r["pipeline"] == name]
        if mine:
            print(
                f"{name:4}: reward {[round(r['reward_mean'], 3) for r in mine]}, mean |log ratio| "
                f"{[round(r['mean_abs_log_ratio'], 4) for r in mine]}, "
                f"differing {[r['differing_tokens'] for r in mine]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

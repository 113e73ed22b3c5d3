"""`tito-agents compare`: the trainer-view comparison (tito samples vs a text pipeline) as a table,
or as an HTML page with the histogram of log ratios of both pipelines; or an RL loop's steps.

Reads the JSON that `examples/rl_step.py` (`make rl-step`) or `Comparison.to_dict()` writes, or the
`loop.json` of `examples/rl_loop.py` (`make rl-loop`: one row per step and pipeline, rendered by
`tito_agents.rl.loop_plot`); the scoring itself needs torch and the model
(`tito_agents.trainer_check`), the tables and plots do not.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tito_agents.cli._errors import EXIT_OK, CliInputError
from tito_agents.cli._files import user_path, write_output
from tito_agents.rl.loop_plot import is_loop, loop_lines, render_loop_html
from tito_agents.trainer_check.plot import render_html

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="plot a trainer-view comparison (log ratios: tito samples vs a text pipeline)",
        description="Show or plot the comparison JSON written by `make rl-step` "
        "(examples/rl_step.py) or by tito_agents.trainer_check.Comparison.to_dict(), or the "
        "loop.json of `make rl-loop` (examples/rl_loop.py).",
    )
    parser.add_argument("comparison", help="the comparison JSON file")
    parser.add_argument("--html", metavar="FILE", help="write the plot and table to this HTML file")
    parser.set_defaults(handler=run)


HOW_TO_PRODUCE = (
    "a comparison is written by `make rl-step` (out/rl-step/comparison.json; examples/rl_step.py, "
    "needs torch and the model), or by saving "
    "tito_agents.trainer_check.compare(samples, calls, model_dir).to_dict() as JSON"
)
"""What `compare` reads is not a samples file: every refusal says where the file comes from."""


def _load(path: str) -> dict[str, Any]:
    try:
        data = json.loads(user_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CliInputError(path, f"no such file; {HOW_TO_PRODUCE}") from None
    except json.JSONDecodeError as exc:
        lines = " (JSON Lines: a samples file?)" if exc.msg == "Extra data" else ""
        raise CliInputError(
            path, f"not JSON ({exc.msg}, line {exc.lineno}){lines}; {HOW_TO_PRODUCE}"
        ) from None
    except UnicodeDecodeError:
        raise CliInputError(
            path, f"not JSON (not UTF-8 text: a binary file?); {HOW_TO_PRODUCE}"
        ) from None
    if not isinstance(data, dict) or ("tito" not in data and not is_loop(data)):
        what = (
            "a samples file, not a comparison (`tito-agents stats` reads those)"
            if isinstance(data, dict) and "token_ids" in data
            else "not a trainer-view comparison (no 'tito' figures) nor an RL loop's steps"
        )
        raise CliInputError(path, f"{what}; {HOW_TO_PRODUCE}")
    if not (data["rows"] if is_loop(data) else data["tito"]):
        raise CliInputError(
            path,
            f"holds no figures (no 'tito' results, or a loop with no steps); {HOW_TO_PRODUCE}",
        )
    return data


def _line(name: str, figures: dict[str, Any]) -> str:
    free = figures["free"]
    return (
        f"{name:24} free: mean |log ratio| {free['mean_abs']:.4f}  max {free['max_abs']:.3f}  "
        f"outside clip {free['outside_clip']}/{free['tokens']}   "
        f"≠ sampled id {figures['differing']}/{figures['trained_tokens']}"
    )


def _render(data: dict[str, Any], html: bool) -> str:
    """The page or the table lines; raises what the data's shape makes the renderers raise."""
    if is_loop(data):
        return render_loop_html(data) if html else "\n".join(loop_lines(data)) + "\n"
    if html:
        return render_html(data)
    lines = [
        _line(f"tito {dtype} {layout}", figures)
        for dtype, layouts in data["tito"].items()
        for layout, figures in layouts.items()
    ]
    lines += [
        _line(f"text pipeline {dtype}", figures) for dtype, figures in data.get("text", {}).items()
    ]
    return "".join(line + "\n" for line in lines)


def run(args: argparse.Namespace) -> int:
    data = _load(args.comparison)
    try:  # rendered whole before anything is written: a malformed file leaves no partial page
        text = _render(data, html=bool(args.html))
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else f"malformed: {exc}"
        raise CliInputError(args.comparison, f"not a usable comparison ({what})") from exc
    if args.html:
        sys.stdout.write(f"wrote {write_output(args.html, text)}\n")
    else:
        sys.stdout.write(text)
    return EXIT_OK

"""The comparison as a page a person would rather look at than read: one self-contained HTML file
with the histogram of log ratios of both pipelines (inline SVG, no script, no dependency) and the
figures table. Works on the JSON of `Comparison.to_dict()`, so it needs neither torch nor the model.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BINS = 48
LIMIT = 1.0
"""The histogram spans log ratios in `[-LIMIT, LIMIT]`; values beyond land in the end bins."""
COLORS = {"tito": "#2a7ab0", "text": "#d9534f"}
WIDTH, HEIGHT, PAD = 760, 300, 40


def _bars(values: Sequence[float], color: str, peak: float) -> str:
    """One pipeline's histogram as SVG rects (log-scaled heights, so rare tails stay visible)."""
    if not values:
        return ""
    clipped = np.clip(np.asarray(values, dtype=np.float64), -LIMIT, LIMIT)
    counts, edges = np.histogram(clipped, bins=BINS, range=(-LIMIT, LIMIT))
    fractions = counts / max(1, counts.sum())
    x_scale = (WIDTH - 2 * PAD) / (2 * LIMIT)
    parts = []
    for count, fraction, left in zip(counts, fractions, edges[:-1], strict=True):
        if count == 0:
            continue
        height = (HEIGHT - 2 * PAD) * math.log10(1 + 1000 * fraction) / math.log10(1 + 1000 * peak)
        x = PAD + (left + LIMIT) * x_scale
        parts.append(
            f'<rect x="{x:.1f}" y="{HEIGHT - PAD - height:.1f}" width="{x_scale * 2 * LIMIT / BINS:.1f}" '
            f'height="{height:.1f}" fill="{color}" fill-opacity="0.55">'
            f"<title>{count} tokens in [{left:.3f}, {left + 2 * LIMIT / BINS:.3f})</title></rect>"
        )
    return "".join(parts)


def histogram_svg(series: Mapping[str, Sequence[float]], clip: float) -> str:
    """Overlaid histograms of the free-token log ratios, with the PPO clip range marked."""
    peak = 0.0
    for values in series.values():
        if values:
            clipped = np.clip(np.asarray(values, dtype=np.float64), -LIMIT, LIMIT)
            counts, _ = np.histogram(clipped, bins=BINS, range=(-LIMIT, LIMIT))
            peak = max(peak, float(counts.max() / counts.sum()))
    peak = peak or 1.0
    x_scale = (WIDTH - 2 * PAD) / (2 * LIMIT)
    body = [_bars(values, COLORS.get(name, "#777"), peak) for name, values in series.items()]
    guides = []
    for value in (math.log(1 - clip), math.log(1 + clip)):
        x = PAD + (value + LIMIT) * x_scale
        guides.append(
            f'<line x1="{x:.1f}" y1="{PAD - 10}" x2="{x:.1f}" y2="{HEIGHT - PAD}" stroke="#444" '
            'stroke-dasharray="4 3"/>'
        )
    ticks = []
    for tick in (-1.0, -0.5, 0.0, 0.5, 1.0):
        x = PAD + (tick + LIMIT) * x_scale
        label = f"{tick:g}" if abs(tick) < LIMIT else f"{'≤' if tick < 0 else '≥'}{tick:g}"
        ticks.append(
            f'<text x="{x:.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle" font-size="11">'
            f"{label}</text>"
        )
    legend = "".join(
        f'<rect x="{WIDTH - 190}" y="{12 + 18 * i}" width="12" height="12" '
        f'fill="{COLORS.get(name, "#777")}" fill-opacity="0.55"/><text x="{WIDTH - 172}" '
        f'y="{22 + 18 * i}" font-size="12">{html.escape(name)} ({len(values)} tokens)</text>'
        for i, (name, values) in enumerate(series.items())
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif"><line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" '
        f'y2="{HEIGHT - PAD}" stroke="#444"/>{"".join(body)}{"".join(guides)}{"".join(ticks)}'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 6}" text-anchor="middle" font-size="12">'
        "log ratio = trainer logprob − rollout logprob (free-running tokens; dashed: PPO clip; "
        f"heights log-scaled)</text>{legend}</svg>"
    )


def _row(name: str, figures: Mapping[str, Any]) -> str:
    free = figures["free"]
    cons = figures["constrained"]

    def cell(stats: Mapping[str, Any]) -> str:
        if not stats["tokens"]:
            return "<td>–</td><td>–</td><td>–</td>"
        return (
            f"<td>{stats['mean_abs']:.4f}</td><td>{stats['max_abs']:.3f}</td>"
            f"<td>{stats['outside_clip']} / {stats['tokens']}</td>"
        )

    return (
        f"<tr><th>{html.escape(name)}</th>{cell(free)}{cell(cons)}"
        f"<td>{figures['differing']} / {figures['trained_tokens']}</td></tr>"
    )


def render_html(data: Mapping[str, Any]) -> str:
    """The whole page for a `Comparison.to_dict()` mapping."""
    clip = float(data.get("clip", 0.2))
    rows = []
    for dtype, layouts in data.get("tito", {}).items():
        for layout, figures in layouts.items():
            rows.append(_row(f"tito {dtype} {layout}", figures))
    for dtype, figures in data.get("text", {}).items():
        rows.append(_row(f"text pipeline {dtype}", figures))
    extra = data.get("extra") or {}
    notes = []
    if "step" in extra:
        step = extra["step"]
        notes.append(
            f"GRPO step: loss {step['loss']:.4f} on {step['tokens']} tokens, "
            f"{100 * step['changed_bf16']:.1f}% of bf16 weights changed."
        )
    if "round2" in extra:
        r2 = extra["round2"]
        free = r2["fp32_pack"]["free"]
        notes.append(
            f"Round 2 on the updated weights (policy_version {', '.join(r2['policy_versions'])}):"
            f" {r2['samples']} samples, mean |log ratio| {free['mean_abs']:.4f}, "
            f"{r2['fp32_pack']['differing']} trained tokens differ from the sampled ids."
        )
    svg = histogram_svg(data.get("log_ratios", {}), clip)
    header = (
        "<tr><th></th><th colspan=3>free-running tokens</th><th colspan=3>constrained tokens "
        "(masked rollout logprobs)</th><th>trained tokens</th></tr><tr><th>pipeline</th>"
        "<th>mean |log r|</th><th>max</th><th>outside clip</th><th>mean |log r|</th><th>max</th>"
        "<th>outside clip</th><th>≠ sampled id</th></tr>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tito-agents: trainer view"
        "</title><style>body{font-family:sans-serif;margin:2em;max-width:64em}"
        "table{border-collapse:collapse}td,th{padding:3px 9px;border-bottom:1px solid #ddd;"
        "text-align:right}th:first-child{text-align:left}</style></head><body>"
        "<h1>Trainer's view: tito samples vs a text pipeline</h1>"
        f"<p>{data.get('samples', 0)} samples, {data.get('calls', 0)} calls, scored by "
        f"<code>{html.escape(str(data.get('model', '')))}</code>. Importance ratio = "
        "exp(trainer logprob − rollout logprob) on every trained token; PPO clips it to "
        f"[{1 - clip:g}, {1 + clip:g}].</p>{svg}<table>{header}{''.join(rows)}</table>"
        + "".join(f"<p>{html.escape(n)}</p>" for n in notes)
        + "</body></html>"
    )

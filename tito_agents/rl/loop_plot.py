"""The RL loop's curves as a page read at a glance: reward and mean |log ratio| per step, tito
beside the text pipeline (inline SVG, no script, no dependency; the colours of
`trainer_check.plot`), and the rows as a table. `to_png` screenshots it with a headless Chromium
when one is installed (`make sysdeps` installs it), since the package ships no plotting library.

Works on the JSON `examples/rl_loop.py` writes (`{"rows": [...], ...}`), without torch.
"""

from __future__ import annotations

import html
import math
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = {"tito": "#2a7ab0", "text": "#d9534f"}
WIDTH, HEIGHT, PAD = 520, 260, 44
COLUMNS = (
    "pipeline",
    "step",
    "policy_version",
    "reward_mean",
    "reward_std",
    "mean_abs_log_ratio",
    "frac_outside_clip",
    "rows_downweighted",
    "differing_tokens",
    "trained_tokens",
    "weight_update_s",
    "rollout_s",
    "convert_s",
    "train_s",
    "step_s",
)


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value)):
        return float(value)
    return None


def curve_svg(
    rows: Sequence[Mapping[str, Any]],
    key: str,
    title: str,
    clip: float | None,
    *,
    log: bool = False,
) -> str:
    """One panel: `key` against `step`, a line per pipeline; `clip` marks a reference level;
    `log`: a log10 axis (values below 1e-4 drawn at 1e-4), for curves orders of magnitude apart."""
    scale = (lambda v: math.log10(max(v, 1e-4))) if log else (lambda v: v)
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        value = _number(row.get(key))
        if value is not None:
            series.setdefault(str(row["pipeline"]), []).append((float(row["step"]), scale(value)))
    clip = scale(clip) if clip else None
    points = [p for line in series.values() for p in line]
    if not points:
        return f"<p>{html.escape(title)}: no values</p>"
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    y_hi = max([p[1] for p in points] + ([clip] if clip else []))
    y_lo = min(p[1] for p in points) if log else min(0.0, *(p[1] for p in points))
    y_hi = y_hi if y_hi > y_lo else y_lo + 1.0
    span_x = x_hi - x_lo or 1.0

    def label(y: float) -> float:
        return 10**y if log else y

    def xy(x: float, y: float) -> str:
        px = PAD + (x - x_lo) / span_x * (WIDTH - 2 * PAD)
        py = HEIGHT - PAD - (y - y_lo) / (y_hi - y_lo) * (HEIGHT - 2 * PAD)
        return f"{px:.1f},{py:.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">',
        f'<text x="{PAD}" y="18" font-size="14">{html.escape(title)}</text>',
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
        'stroke="#888"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>',
        f'<text x="4" y="{PAD + 4}" font-size="11">{label(y_hi):.3g}</text>',
        f'<text x="4" y="{HEIGHT - PAD}" font-size="11">{label(y_lo):.3g}</text>',
        f'<text x="{PAD}" y="{HEIGHT - PAD + 16}" font-size="11">step {x_lo:g}</text>',
        f'<text x="{WIDTH - PAD - 40}" y="{HEIGHT - PAD + 16}" font-size="11">{x_hi:g}</text>',
    ]
    if clip:
        parts.append(
            f'<polyline points="{xy(x_lo, clip)} {xy(x_hi, clip)}" stroke="#999" '
            'stroke-dasharray="4 3" fill="none"/>'
        )
    for index, (name, line) in enumerate(sorted(series.items(), reverse=True)):
        color = COLORS.get(name, "#555")
        coords = " ".join(xy(x, y) for x, y in line)
        parts.append(f'<polyline points="{coords}" stroke="{color}" stroke-width="2" fill="none"/>')
        parts.extend(
            f'<circle cx="{xy(x, y).split(",")[0]}" cy="{xy(x, y).split(",")[1]}" r="3" '
            f'fill="{color}"><title>{name} step {x:g}: {label(y):.4g}</title></circle>'
            for x, y in line
        )
        parts.append(
            f'<text x="{WIDTH - PAD - 60}" y="{PAD + 14 * index}" font-size="12" '
            f'fill="{color}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if 0 < abs(value) < 0.01:
            return f"{value:.2g}"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return html.escape(str(value))


def render_loop_html(data: Mapping[str, Any]) -> str:
    """The page for a loop.json mapping: two curves and the rows."""
    rows: Sequence[Mapping[str, Any]] = data.get("rows", [])
    panels = curve_svg(
        rows, "reward_mean", "reward (mean of the step's episodes)", None
    ) + curve_svg(
        rows,
        "mean_abs_log_ratio",
        "mean |log ratio| trainer vs. rollout (log scale; dashed: 0.05)",
        0.05,
        log=True,
    )
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in COLUMNS) + "</tr>" for r in rows
    )
    notes = "".join(f"<p>{html.escape(str(n))}</p>" for n in data.get("notes", []))
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>tito-agents: RL loop</title>"
        "<style>body{font-family:sans-serif;margin:1.5em;width:1240px}table{border-collapse:"
        "collapse;font-size:11px}td,th{padding:2px 5px;border-bottom:1px solid #ddd;"
        "text-align:right}</style></head><body><h2>GRPO steps on tito samples vs. a text "
        f"pipeline</h2><div>{panels}</div>{notes}<table><tr>{head}</tr>{body}</table>"
        "</body></html>"
    )


def to_png(page: str, out: Path, *, width: int = 1290, height: int = 560) -> bool:
    """Screenshot `page` into `out` with a headless Chromium; False when none is installed or
    it fails (the HTML page is the plot then)."""
    browser = next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p),
        None,
    )
    if browser is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        page_file = Path(tmp) / "loop.html"
        page_file.write_text(page, encoding="utf-8")
        command = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp}/profile",
            f"--window-size={width},{height}",
            f"--screenshot={out.resolve()}",
            page_file.as_uri(),
        ]
        try:
            subprocess.run(command, capture_output=True, timeout=120, check=True)
        except (OSError, subprocess.SubprocessError):
            return False
    return out.is_file()


def is_loop(data: Mapping[str, Any]) -> bool:
    """Whether a JSON mapping is a loop.json (rows of steps), not a trainer-view comparison."""
    rows = data.get("rows")
    return isinstance(rows, list) and all(isinstance(r, dict) and "pipeline" in r for r in rows)


def loop_lines(data: Mapping[str, Any]) -> list[str]:
    """One line per step and pipeline, for a terminal (`tito-agents compare loop.json`)."""
    out = []
    for row in data.get("rows", []):
        out.append(
            f"{row['pipeline']:4} step {row['step']:>3}  v{row.get('policy_version')}  reward "
            f"{row['reward_mean']:.3f}  mean |log ratio| {row['mean_abs_log_ratio']:.4f}  "
            f"outside clip {100 * row['frac_outside_clip']:.1f}%  ≠ sampled id "
            f"{row['differing_tokens']}/{row['trained_tokens']}  update "
            f"{row['weight_update_s']:.2f} s  step {row['step_s']:.0f} s"
        )
    return out

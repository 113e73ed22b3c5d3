"""`tito_agents.rl.loop_plot`: the loop's rows as curves (reward, and mean |log ratio| on a log
axis), a table and terminal lines; recognised apart from a trainer-view comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_agents.rl import loop_plot


def rows() -> list[dict[str, Any]]:
    out = []
    for pipeline, ratio in (("tito", 0.04), ("text", 0.9)):
        for step in (1, 2):
            out.append(
                {
                    "pipeline": pipeline,
                    "step": step,
                    "policy_version": str(step - 1),
                    "reward_mean": 0.25 * step,
                    "reward_std": 0.1,
                    "mean_abs_log_ratio": ratio / step,
                    "frac_outside_clip": 0.0 if pipeline == "tito" else 0.125,
                    "differing_tokens": 0 if pipeline == "tito" else 7,
                    "trained_tokens": 200,
                    "weight_update_s": 0.5,
                    "convert_s": 0.0003,
                    "step_s": 30.0,
                }
            )
    return out


def test_page_has_both_curves_and_every_row() -> None:
    page = loop_plot.render_loop_html({"rows": rows()})
    assert page.count("<svg") == 2 and page.count("<polyline") >= 5  # 2 curves x 2, clip line
    assert "log scale" in page and page.count("<tr>") == 1 + 4
    assert "text step 2: 0.45" in page  # the tooltip shows the value, not its log
    assert "0.0003" in page  # small timings keep their digits


def test_lines_and_kind() -> None:
    data = {"rows": rows()}
    assert loop_plot.is_loop(data) and not loop_plot.is_loop({"tito": {}})
    lines = loop_plot.loop_lines(data)
    assert len(lines) == 4 and "outside clip 12.5%" in lines[-1] and "7/200" in lines[-1]


def test_no_browser_no_png(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(loop_plot.shutil, "which", lambda name: None)
    assert not loop_plot.to_png("<html></html>", tmp_path / "x.png")
    assert "no values" in loop_plot.curve_svg([], "reward_mean", "reward", None)


def test_compare_renders_a_loop_file(tmp_path: Path) -> None:
    """`tito-agents compare loop.json` prints a line per step and pipeline; `--html` writes the
    page with both curves (`make rl-loop` ends with it)."""
    import json
    import subprocess
    import sys

    path = tmp_path / "loop.json"
    path.write_text(json.dumps({"rows": rows()}))
    cli = [sys.executable, "-m", "tito_agents.cli", "compare", str(path)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 4 and "7/200" in done.stdout
    page = tmp_path / "loop.html"
    done = subprocess.run([*cli, "--html", str(page)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert page.read_text().count("<svg") == 2
    path.write_text(json.dumps({"rows": "no"}))
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "RL loop" in done.stderr

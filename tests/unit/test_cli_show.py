"""`tito-agents show`: one sample with its token classes, spans, rewards and rewrite points, in the
terminal and as a self-contained HTML page checked in a real headless Chromium."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.cli_samples import merged_episode, run_cli, write_samples
from tito_agents.cli._layout import CONTEXT, ENV, TRAINED, build_layout
from tito_agents.samples import Sample
from tito_agents.testing.smollm2 import tokenizer_dir

CHROMIUM = Path("/usr/bin/chromium")


def _expected_counts(sample: Sample) -> dict[str, int]:
    """Classes from first principles: trained = loss 1; env = context added by calls after the
    first; context = everything else."""
    trained = int(sample.loss_mask.sum())
    env = sum(s.start - s.context_start for s in sample.spans[1:])
    return {
        "tokens": sample.num_tokens,
        "trained": trained,
        "env": env,
        "context": sample.num_tokens - trained - env,
    }


def test_token_classes_and_rewrite_points() -> None:
    """Each sample's tokens split into context, tool/env and trained, and rewrite points sit where
    samples of the same agent part: A->B at 7, B->C (resample) where sampling starts, 11."""
    samples = merged_episode()
    a, b, c, d, _ = samples
    episode = samples[:4]
    for sample in samples:
        view = build_layout(sample, episode)
        counts = view.counts()
        assert {k: counts[k] for k in _expected_counts(sample)} == _expected_counts(sample)
    view_a = build_layout(a, episode)
    assert (
        view_a.classes[10:14].tolist() == [ENV] * 4 and view_a.classes[:6].tolist() == [CONTEXT] * 6
    )
    assert view_a.classes[6:10].tolist() == [TRAINED] * 4
    marks = {m.kind: m for m in view_a.markers}
    assert (
        marks["diverged_here"].position == 7
        and marks["diverged_here"].other_sample_id == b.sample_id
    )
    marks_b = [(m.kind, m.position, m.other_sample_id) for m in build_layout(b, episode).markers]
    assert ("diverged_from", 7, a.sample_id) in marks_b
    assert ("diverged_here", 11, c.sample_id) in marks_b
    marks_c = [(m.kind, m.position, m.other_sample_id) for m in build_layout(c, episode).markers]
    assert ("diverged_from", 11, b.sample_id) in marks_c
    assert [m.kind for m in build_layout(d, episode).markers] == ["end"]  # per-call: no divergence


def test_terminal_output_without_colour(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Plain output shows the header with reward and reasons, the spans table, class tags, token
    boundaries as `|` and the rewrite point inline and listed."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    code, out, _ = run_cli(["show", path, "--sample", "BBBB", "--color", "never"], capsys)
    assert code == 0 and "\x1b[" not in out
    assert f"sample {'B' * 24}" in out and "reward 1" in out and "start template_rerender" in out
    assert "c3/0" in out and "0:11" in out and "11:13" in out
    assert "«context call 0»1|2|3|4|5|6|100⟂template_rerender⟂150|151" in out
    assert "«trained call 0»107|108⟂resample⟂" in out
    assert f"⟂ @7: rewrite point: differs from sample {'A' * 24} here (template_rerender)" in out


def test_terminal_output_with_colour_and_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a tokenizer, tokens are shown as text with visible newlines; with colour, each class has
    its own colours and neighbouring tokens alternate shades."""
    from tito_agents.testing.smollm2 import load_tokenizer

    tok = load_tokenizer()
    prompt = tok.encode(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    sampled = tok.encode("Hello there<|im_end|>", add_special_tokens=False)
    sample = merged_episode()[3]
    sample.token_ids = np.asarray([*prompt, *sampled], dtype=np.int32)
    sample.loss_mask = np.asarray([0] * len(prompt) + [1] * len(sampled), dtype=np.uint8)
    sample.spans[0].start, sample.spans[0].end = len(prompt), len(prompt) + len(sampled)
    path = write_samples(tmp_path / "s.jsonl", [sample])
    code, out, _ = run_cli(
        ["show", path, "--tokenizer", tokenizer_dir(), "--color", "always"], capsys
    )
    assert code == 0
    assert "48;5;236" in out and "48;5;238" in out  # context, two shades
    assert "48;5;22" in out  # trained
    assert "Hello" in out and " there" in out and "↵" in out
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "<|im_start|>user↵" in plain


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json gives counts, spans, rewards and markers of the chosen sample (by index here)."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    code, out, _ = run_cli(["show", path, "--index", "0", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["sample_id"] == samples[0].sample_id
    assert {k: data["counts"][k] for k in _expected_counts(samples[0])} == _expected_counts(
        samples[0]
    )
    assert data["reward"] == 1.5 and [s["reward"] for s in data["spans"]] == [None, 0.5]
    assert [m["kind"] for m in data["markers"]] == ["diverged_here", "end"]


def test_unknown_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Asking for a sample that is not there is a one-line error saying how many were scanned."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    code, _, err = run_cli(["show", path, "--sample", "nope"], capsys)
    assert code == 2 and "no sample id 'nope' among 5 samples" in err


def test_ambiguous_id_prefix_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A prefix that several sample ids share is refused naming them; a unique prefix is found even
    when it is the last sample; an exact id wins over ids it is a prefix of."""
    samples = merged_episode()
    twins = [
        dataclasses.replace(samples[4], sample_id="E1", episode_id="ep3"),
        dataclasses.replace(samples[4], sample_id="E12", episode_id="ep4"),
    ]
    path = write_samples(tmp_path / "s.jsonl", [*samples, *twins])
    code, out, err = run_cli(["show", path, "--sample", "E", "--json"], capsys)
    assert code == 2 and out == ""
    assert "ambiguous" in err and "3 samples match" in err and "E1, E12" in err
    code, out, _ = run_cli(["show", path, "--sample", "E12", "--json"], capsys)
    assert code == 0 and json.loads(out)["sample_id"] == "E12"
    code, out, _ = run_cli(["show", path, "--sample", "E1", "--json"], capsys)
    assert code == 0 and json.loads(out)["sample_id"] == "E1"
    code, out, _ = run_cli(["show", path, "--sample", "BB", "--json"], capsys)
    assert code == 0 and json.loads(out)["sample_id"] == "B" * 24


def test_html_into_a_missing_folder_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--html` never creates folders: a missing parent folder is a one-line error, nothing made."""
    path = write_samples(tmp_path / "s.jsonl", merged_episode())
    out = tmp_path / "no" / "such" / "page.html"
    code, _, err = run_cli(["show", path, "--html", out], capsys)
    assert code == 2 and "does not exist" in err and not (tmp_path / "no").exists()


def _static_counts(page: str) -> dict[str, int]:
    found = re.findall(r"""id=['"]count-(\w+)['"] data-count=['"](\d+)['"]""", page)
    return {k: int(v) for k, v in found}


def test_html_page_is_self_contained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The page has its counts as static HTML, one element per token with its class, the markers
    and no external resource."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    out = tmp_path / "page.html"
    code, text, _ = run_cli(["show", path, "--html", out], capsys)
    assert code == 0 and f"wrote {out}" in text
    page = out.read_text()
    counts = _static_counts(page)
    assert {k: counts[k] for k in _expected_counts(samples[0])} == _expected_counts(samples[0])
    assert page.count("data-i='") == samples[0].num_tokens
    assert "http://" not in page and "https://" not in page and "src=" not in page
    assert "rewrite point: sample " + "B" * 24 in html.unescape(page)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / "chromium-profile"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)"
)
def test_html_page_in_headless_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real headless Chromium renders the page and takes a screenshot; after its script ran, the
    tokens it finds drawn by class (recorded in an attribute, never as text on the page) equal the
    static counts and the sample's own."""
    samples = merged_episode()
    path = write_samples(tmp_path / "s.jsonl", samples)
    page = tmp_path / "page.html"
    code, _, _ = run_cli(["show", path, "--sample", "BBBB", "--html", page], capsys)
    assert code == 0
    shot = tmp_path / "page.png"
    result = _chromium(tmp_path, "--window-size=1000,800", f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), result.stderr[-2000:]
    assert _png_size(shot) == (1000, 800)
    result = _chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = result.stdout
    found = re.search(r'data-drawn="([^"]+)"', dom)
    assert found, (result.returncode, result.stderr[-2000:])
    drawn: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    expected = _expected_counts(samples[1])
    assert {k: drawn[k] for k in expected} == expected
    assert drawn["rewrite_points"] == 2  # from A at 7, to C at 11
    static = _static_counts(dom)
    assert {k: static[k] for k in expected} == expected
    assert "drawn on this page" not in dom and "script did not run" not in dom


def _constrained_sample(tok: Any) -> Sample:
    """One per-call sample of a forced tool call: its span was sampled under a constraint and
    re-scored (policy logprobs differ from the rollout's by a known gap); the sampled text holds an
    emoji and CJK characters, which SmolLM2 splits into byte tokens."""
    prompt = tok.encode(
        "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    sampled = tok.encode('{"city": "日本 🙂"}<|im_end|>', add_special_tokens=False)
    sample = merged_episode()[3]
    n = len(prompt) + len(sampled)
    sample.token_ids = np.asarray([*prompt, *sampled], dtype=np.int32)
    sample.loss_mask = np.asarray([0] * len(prompt) + [1] * len(sampled), dtype=np.uint8)
    rng = np.random.default_rng(0)
    rollout = np.zeros(n, dtype=np.float32)
    rollout[len(prompt) :] = -rng.uniform(0.0, 3.0, len(sampled))
    policy = rollout.copy()
    policy[len(prompt) :] -= 1.5  # what the mask hid: the policy was less sure
    sample.logprobs, sample.policy_logprobs = rollout, policy
    sample.spans[0] = dataclasses.replace(
        sample.spans[0],
        start=len(prompt),
        end=n,
        constrained="tool_choice=required",
        logprob_source="rescored",
    )
    sample.validate()
    return sample


def test_show_marks_constrained_spans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The terminal view says how many trained tokens were sampled under a constraint, tags them
    inline, and the spans table names the constraint and what its logprobs are; --json counts them."""
    from tito_agents.testing.smollm2 import load_tokenizer

    sample = _constrained_sample(load_tokenizer())
    path = write_samples(tmp_path / "s.jsonl", [sample])
    code, out, _ = run_cli(["show", path, "--color", "never"], capsys)
    n = sample.num_trained
    assert code == 0
    assert f"constrained: {n} trained tokens sampled under a constraint" in out
    assert "≋tool_choice=required≋«trained call 0»" in out
    assert "tool_choice=required (rescored)" in out
    _, out, _ = run_cli(["show", path, "--json"], capsys)
    data = json.loads(out)
    assert data["counts"]["constrained"] == n
    assert data["spans"][0]["constrained"] == "tool_choice=required"


def test_html_shades_logprobs_gaps_and_draws_split_characters_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page shades each trained token by its logprob and by its rollout/policy gap, outlines
    constrained tokens, draws the emoji and CJK characters whole on the runs of byte tokens that
    hold them (never U+FFFD), and shows no self-check text."""
    from tito_agents.testing.smollm2 import load_tokenizer

    sample = _constrained_sample(load_tokenizer())
    path = write_samples(tmp_path / "s.jsonl", [sample])
    out = tmp_path / "page.html"
    code, _, _ = run_cli(["show", path, "--tokenizer", tokenizer_dir(), "--html", out], capsys)
    assert code == 0
    page = out.read_text()
    text = html.unescape(re.sub(r"<[^>]+>", "", page.split("<div id='tokens'")[1]))
    assert "🙂" in text and "日" in text and "本" in text and "\ufffd" not in page
    runs = [int(n) for n in re.findall(r"data-n='(\d+)'", page)]
    spans = re.findall(r"<span class='t ([^']*)'( data-i=[^>]*)>", page)
    assert sum(runs) + len(spans) - len(runs) == sample.num_tokens  # every token drawn once
    assert runs and all(n >= 2 for n in runs)
    trained = [attrs for classes, attrs in spans if classes.startswith("trained")]
    assert trained and all("constrained" in c for c, _ in spans if c.startswith("trained"))
    assert all("--lpc:hsl(" in a and "--gapc:rgba(220,38,38," in a for a in trained)
    gaps = [float(g) for g in re.findall(r"data-gap='([\d.]+)'", page)]
    assert gaps and all(
        g == pytest.approx(1.5 * len_) for g, len_ in zip(gaps, _run_lengths(spans), strict=True)
    )
    assert "body class='shade-logprob'" in page and "value='gap'" in page
    assert "<td>tool_choice=required</td><td>rescored</td>" in page
    assert "mean |rollout - policy| 1.500" in page
    assert "drawn on this page" not in page and "script did not run" not in page


def _run_lengths(spans: list[tuple[str, str]]) -> list[int]:
    """Tokens per drawn trained element, in order."""
    lengths = []
    for classes, attrs in spans:
        if classes.startswith("trained"):
            found = re.search(r"data-n='(\d+)'", attrs)
            lengths.append(int(found.group(1)) if found else 1)
    return lengths


def _png_pixels(path: Path) -> list[tuple[int, int, int]]:
    """The RGB pixels of an 8-bit RGB/RGBA PNG (Chromium's screenshots), decoded by hand."""
    data = path.read_bytes()
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height = struct.unpack(">II", header[:8])
    depth, colour = header[8], header[9]
    assert depth == 8 and colour in (2, 6)
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * step
    previous = bytearray(stride)
    pixels = []
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - step] if x >= step else 0
            b = previous[x]
            c = previous[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + a) & 255
            elif kind == 2:
                line[x] = (line[x] + b) & 255
            elif kind == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [tuple(line[x : x + 3]) for x in range(0, stride, step)]
        previous = line
    return pixels  # type: ignore[return-value]


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)"
)
def test_html_shading_is_drawn_in_headless_chromium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a real Chromium the trained tokens are painted in their logprob colours (not the flat
    class green): the screenshot holds the colour of each logprob shade the page assigns."""
    from tito_agents.testing.smollm2 import load_tokenizer

    sample = _constrained_sample(load_tokenizer())
    path = write_samples(tmp_path / "s.jsonl", [sample])
    page = tmp_path / "page.html"
    code, _, _ = run_cli(["show", path, "--tokenizer", tokenizer_dir(), "--html", page], capsys)
    assert code == 0
    shot = tmp_path / "page.png"
    result = _chromium(tmp_path, "--window-size=1000,900", f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), result.stderr[-2000:]
    colours = set(_png_pixels(shot))
    hues = {int(h) for h in re.findall(r"--lpc:hsl\((\d+),75%,78%\)", page.read_text())}
    assert len(hues) >= 3
    drawn = [h for h in hues if any(_close(c, _hsl(h, 0.75, 0.78)) for c in colours)]
    assert len(drawn) == len(hues), (sorted(hues), sorted(drawn))


def _hsl(hue: int, s: float, lightness: float) -> tuple[int, int, int]:
    import colorsys

    r, g, b = colorsys.hls_to_rgb(hue / 360, lightness, s)
    return round(r * 255), round(g * 255), round(b * 255)


def _close(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return all(abs(x - y) <= 3 for x, y in zip(a, b, strict=True))

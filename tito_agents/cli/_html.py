"""The self-contained HTML page of `show --html`: inline CSS and JS, no external resources.

What a trainer looks for at a glance: which tokens are trained, how sure the model was of each
(trained tokens shaded by their logprob), where the rollout's logprobs differ from the policy's
(shaded by the gap, where `policy_logprobs` exists), which spans were sampled under a constraint
(outlined: their rollout logprobs are post-mask), and where samples part. A character split
across tokens (one byte of an emoji per token) is drawn whole, on the run of tokens that holds it.

The counts are static HTML (`#counts`); the inline script only switches the shading and shows a
token's details on hover. It records what it drew by class in `body[data-drawn]` (an attribute,
never text on the page) so a browser check can compare it with the counts.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tito_agents.cli._layout import CLASS_NAMES, REWRITE_KINDS, TRAINED, TokenLayout

__all__ = ["Run", "render_html"]

Run = tuple[int, int, str]
"""`(start, end, text)`: tokens `start:end` drawn as one element showing `text`."""

_GAP_FULL = 2.0
"""A rollout/policy gap (nats) drawn at full strength."""

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fafafa}
h1{font-size:1.25em;margin:0 0 .4em} code{font-size:.95em}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:.5em 0}
dl.meta dt{color:#666} dl.meta dd{margin:0}
#counts{display:flex;gap:1.2em;flex-wrap:wrap;margin:.6em 0}
#counts span b{font-variant-numeric:tabular-nums}
table{border-collapse:collapse;margin:.6em 0} td,th{padding:.15em .7em;border-bottom:1px solid #ddd;
text-align:left} th{color:#666;font-weight:600}
tr.constrained td{background:#fdf2f8}
.legend span.t{padding:0 .4em}
.scale{display:inline-block;width:8em;height:.9em;vertical-align:middle;border:1px solid #ccc}
.scale.lp{background:linear-gradient(90deg,hsl(0,75%,78%),hsl(60,75%,78%),hsl(120,75%,78%))}
.scale.gap{background:linear-gradient(90deg,#fff,rgba(220,38,38,1))}
#shading{margin:.5em 0} #shading label{margin-right:1em}
#tokens{white-space:pre-wrap;word-break:break-all;font:13px/1.7 ui-monospace,Menlo,Consolas,monospace;
background:#fff;border:1px solid #ddd;padding:.8em;border-radius:6px}
.t{border-left:1px solid rgba(0,0,0,.18);padding:1px 0;border-radius:2px}
.t.context{background:#e8e8ec;color:#333}.t.context.odd{background:#d9d9df}
.t.env{background:#ffe7b3;color:#5a3b00}.t.env.odd{background:#ffd98a}
.t.trained{background:#c9f2d0;color:#0b4d1c}.t.trained.odd{background:#aee8b8}
body.shade-logprob .t.trained[data-lp]{background:var(--lpc);color:#111}
body.shade-gap .t.trained[data-gap]{background:var(--gapc);color:#111}
body.shade-gap .t.trained:not([data-gap]){background:#fff;color:#999}
.t.constrained{outline:1px dashed #be185d;outline-offset:-1px}
.t.run{text-decoration:underline dotted #888}
.t:hover{outline:2px solid #3b82f6}
#tokens.ids .t{margin-right:.3em;padding:1px .15em}
.marker{display:inline-block;background:#c026d3;color:#fff;font-weight:700;border-radius:3px;
padding:0 .35em;margin:0 .15em;font-size:11px;cursor:help}
.marker.end{background:#6b7280}.marker.start{background:#9333ea}
ul.markers li{margin:.2em 0}
#tip{position:fixed;display:none;background:#111;color:#fff;padding:.35em .6em;border-radius:4px;
font:12px ui-monospace,monospace;pointer-events:none;white-space:pre}
"""

_JS = """
(function(){
  var names=%s, drawn={tokens:0};
  names.forEach(function(n){drawn[n]=0;});
  document.querySelectorAll('#tokens .t').forEach(function(el){
    var n=parseInt(el.dataset.n||'1',10); drawn.tokens+=n;
    names.forEach(function(c){if(el.classList.contains(c)) drawn[c]+=n;});});
  drawn.rewrite_points=document.querySelectorAll('#tokens .marker.rewrite').length;
  document.body.setAttribute('data-drawn', JSON.stringify(drawn));
  document.querySelectorAll('#shading input').forEach(function(input){
    input.addEventListener('change',function(){
      document.body.classList.remove('shade-class','shade-logprob','shade-gap');
      document.body.classList.add('shade-'+input.value);});});
  var tip=document.getElementById('tip');
  document.getElementById('tokens').addEventListener('mousemove',function(e){
    var el=e.target; if(!el.classList||!el.classList.contains('t')){tip.style.display='none';return;}
    var d=el.dataset;
    tip.textContent='#'+d.i+(d.n?' ('+d.n+' tokens)':'')+'  id '+d.id+'  '+d.c+
      (d.call?'  call '+d.call:'')+(d.lp?'  logprob '+d.lp:'')+(d.plp?'  policy '+d.plp:'')+
      (d.gap?'  gap '+d.gap:'')+(d.k?'  constrained: '+d.k:'');
    tip.style.left=(e.clientX+12)+'px'; tip.style.top=(e.clientY+12)+'px'; tip.style.display='block';
  });
})();
"""


def render_html(
    view: TokenLayout, runs: Sequence[Run], *, source: str, ids_only: bool = False
) -> str:
    """The page for one sample. `runs` cover the tokens in order (`_tokenizers.decode_runs`, or one
    id per token when `ids_only`: then tokens are spaced apart, since ids have no spacing)."""
    sample = view.sample
    counts = view.counts()
    esc = html.escape
    policy = _policy(view)
    meta = [
        ("sample", sample.sample_id),
        ("episode", sample.episode_id),
        ("agent", sample.agent or "-"),
        ("model", sample.model or "-"),
        ("task", sample.task_id or "-"),
        ("reward", "-" if sample.reward is None else f"{sample.reward:.6g}"),
        ("start reason", sample.start_reason),
        ("end reason", sample.end_reason),
        ("logprobs", _logprobs_meta(view)),
        ("file", source),
    ]
    shading = "logprob" if sample.logprobs is not None else "class"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tito-agents sample {esc(sample.sample_id)}</title><style>{_CSS}</style></head>",
        f"<body class='shade-{shading}' data-sample-id='{esc(sample.sample_id)}'>",
        f"<h1>Sample <code>{esc(sample.sample_id)}</code></h1><dl class='meta'>",
        *(f"<dt>{esc(k)}</dt><dd>{esc(str(v))}</dd>" for k, v in meta),
        "</dl><div id='counts'>",
        *(
            f"<span id='count-{k}' data-count='{v}'>{esc(_LABELS[k])} <b>{v}</b></span>"
            for k, v in counts.items()
        ),
        "</div>",
        _spans_table(view),
        _legend(sample.logprobs is not None, policy is not None, shading),
        "<ul class='markers'>",
        *(
            f"<li><span class='marker {_marker_class(m.kind)}'>⟂</span> "
            f"@{m.position}: {esc(m.label)}</li>"
            for m in view.markers
        ),
        "</ul>",
        f"<div id='tokens'{' class=ids' if ids_only else ''}>{_token_spans(view, runs)}</div>",
        "<div id='tip'></div>",
        f"<script>{_JS % _json_list(CLASS_NAMES)}</script></body></html>",
    ]
    return "".join(parts)


def _json_list(names: Sequence[str]) -> str:
    return "[" + ",".join(f'"{n}"' for n in names) + "]"


def _logprobs_meta(view: TokenLayout) -> str:
    sample = view.sample
    if sample.logprobs is None:
        return "no"
    text = "rollout (as sampled)"
    if _policy(view) is not None:
        gaps = _gaps(view)
        if gaps.size:
            text += (
                f"; policy logprobs too: mean |rollout - policy| {float(gaps.mean()):.3f}, "
                f"max {float(gaps.max()):.3f} nats on {gaps.size} trained tokens"
            )
    return text


def _policy(view: TokenLayout) -> npt.NDArray[np.float32] | None:
    """The sample's policy logprobs (None when no span was re-scored)."""
    return view.sample.policy_logprobs


def _gaps(view: TokenLayout) -> npt.NDArray[np.float32]:
    """|rollout - policy| logprob on each trained token (empty without both)."""
    logprobs, policy = view.sample.logprobs, _policy(view)
    if logprobs is None or policy is None:
        return np.zeros(0, dtype=np.float32)
    trained = view.classes == TRAINED
    gaps: npt.NDArray[np.float32] = np.abs(logprobs[trained] - policy[trained])
    return gaps


def _legend(logprobs: bool, policy: bool, shading: str) -> str:
    choices = [("class", "token class")]
    if logprobs:
        choices.append(("logprob", "trained tokens by logprob"))
    if policy:
        choices.append(("gap", "trained tokens by rollout/policy gap"))
    radios = "".join(
        f"<label><input type='radio' name='shade' value='{v}'"
        f"{' checked' if v == shading else ''}> {label}</label>"
        for v, label in choices
    )
    scales = ""
    if logprobs:
        scales += " <span class='scale lp'></span> probability 0 → 1"
    if policy:
        scales += f" <span class='scale gap'></span> gap 0 → {_GAP_FULL:g}+ nats"
    return (
        "<p class='legend'>legend: <span class='t context'>context</span> "
        "<span class='t env'>tool / environment</span> <span class='t trained'>trained</span> "
        "<span class='t trained constrained'>sampled under a constraint</span> "
        "<span class='marker rewrite'>⟂</span> rewrite point <span class='marker end'>⟂</span> "
        f"end{scales}</p>"
        + (f"<div id='shading'>shade: {radios}</div>" if len(choices) > 1 else "")
    )


def _marker_class(kind: str) -> str:
    """`rewrite` for rewrite points (counted as such), else the marker's own kind."""
    return "rewrite" if kind in REWRITE_KINDS else kind


_LABELS = {
    "tokens": "tokens",
    "context": "context",
    "env": "tool/env",
    "trained": "trained",
    "constrained": "trained under a constraint",
    "calls": "calls",
    "rewrite_points": "rewrite points",
}


def _spans_table(view: TokenLayout) -> str:
    rows = []
    for k, span in enumerate(view.sample.spans):
        reward = "-" if span.reward is None else f"{span.reward:.6g}"
        constrained, source, error = span.constrained, span.logprob_source, span.rescore_error
        cells = (
            k,
            span.call_id,
            f"{span.context_start}:{span.start}",
            f"{span.start}:{span.end}",
            span.finish_reason or "-",
            reward,
            span.policy_version or "-",
            constrained or "-",
            (source or "-") + (f" ({error})" if error else ""),
        )
        row_class = " class='constrained'" if constrained else ""
        rows.append(
            f"<tr{row_class}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "#",
            "call",
            "context",
            "sampled",
            "finish",
            "reward",
            "policy",
            "constrained",
            "logprobs",
        )
    )
    return f"<table id='spans'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _lp_colour(logprob: float) -> str:
    """Red (improbable) through yellow to green (certain), by the token's probability."""
    p = math.exp(min(0.0, logprob))
    return f"hsl({round(120 * p)},75%,78%)"


def _gap_colour(gap: float) -> str:
    return f"rgba(220,38,38,{min(1.0, gap / _GAP_FULL):.3f})"


def _token_spans(view: TokenLayout, runs: Sequence[Run]) -> str:
    """One `<span class='t CLASS'>` per run (one token, or the tokens of a split character),
    markers inserted before their position."""
    sample = view.sample
    markers_at: dict[int, list[str]] = {}
    for m in view.markers:
        kind = _marker_class(m.kind)
        markers_at.setdefault(m.position, []).append(
            f"<span class='marker {kind}' title='{html.escape(m.label, quote=True)}'>"
            f"⟂ {html.escape(m.reason)}</span>"
        )
    ids = sample.token_ids.tolist()
    calls = view.call_of.tolist()
    classes = view.classes.tolist()
    logprobs = None if sample.logprobs is None else sample.logprobs.tolist()
    policy_array = _policy(view)
    policy = None if policy_array is None else policy_array.tolist()
    constrained = view.constrained_of()
    out: list[str] = []
    for start, end, text in runs:
        for position in range(start, end):  # a mark inside a split character goes before it
            out.extend(markers_at.get(position, ()))
        i = start
        name = CLASS_NAMES[classes[i]]
        extra_class = " odd" if i % 2 else ""
        attrs = f" data-i='{i}' data-id='{' '.join(str(x) for x in ids[start:end])}'"
        attrs += f" data-c='{name}'"
        if end - start > 1:
            extra_class += " run"
            attrs += f" data-n='{end - start}'"
        if calls[i] >= 0:
            attrs += f" data-call='{calls[i]}'"
        if classes[i] == TRAINED:
            constraint = constrained[i]
            if constraint:
                extra_class += " constrained"
                attrs += f" data-k='{html.escape(constraint, quote=True)}'"
            attrs += _logprob_attrs(logprobs, policy, start, end)
        shown = html.escape(text).replace("\n", "↵\n")
        out.append(f"<span class='t {name}{extra_class}'{attrs}>{shown}</span>")
    out.extend(markers_at.get(len(sample.token_ids), ()))
    return "".join(out)


def _logprob_attrs(
    logprobs: list[float] | None, policy: list[float] | None, start: int, end: int
) -> str:
    """Data and shading of a trained run: its logprob (summed over a run: the character's) and,
    with policy logprobs, the policy's and the gap between them."""
    if logprobs is None:
        return ""
    lp = sum(logprobs[start:end])
    attrs = f" data-lp='{lp:.4f}'"
    style = f"--lpc:{_lp_colour(lp)}"
    if policy is not None:
        plp = sum(policy[start:end])
        gap = abs(lp - plp)
        attrs += f" data-plp='{plp:.4f}' data-gap='{gap:.4f}'"
        style += f";--gapc:{_gap_colour(gap)}"
    return attrs + f" style='{style}'"

"""The self-contained HTML page of `show --html`: inline CSS and JS, no external resources.

The counts are written into the page as static HTML (`#counts`), and a small inline script recounts
the token elements by class and writes its own figures into `#js-counts` (and `body[data-js-counts]`),
so a browser check can tell that the page rendered and that the drawn tokens match the summary.
Hovering a token shows its position, id, class, call and logprob.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import orjson

from tito_agents.cli._layout import CLASS_NAMES, REWRITE_KINDS, SampleView

__all__ = ["render_html"]

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fafafa}
h1{font-size:1.25em;margin:0 0 .4em} code{font-size:.95em}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.15em 1em;margin:.5em 0}
dl.meta dt{color:#666} dl.meta dd{margin:0}
#counts,#js-counts{display:flex;gap:1.2em;flex-wrap:wrap;margin:.6em 0}
#counts span b,#js-counts span b{font-variant-numeric:tabular-nums}
#js-counts{color:#666;font-size:.9em}
table{border-collapse:collapse;margin:.6em 0} td,th{padding:.15em .7em;border-bottom:1px solid #ddd;
text-align:left} th{color:#666;font-weight:600}
.legend span.t{padding:0 .4em}
#tokens{white-space:pre-wrap;word-break:break-all;font:13px/1.7 ui-monospace,Menlo,Consolas,monospace;
background:#fff;border:1px solid #ddd;padding:.8em;border-radius:6px}
.t{border-left:1px solid rgba(0,0,0,.18);padding:1px 0;border-radius:2px}
.t.context{background:#e8e8ec;color:#333}.t.context.odd{background:#d9d9df}
.t.env{background:#ffe7b3;color:#5a3b00}.t.env.odd{background:#ffd98a}
.t.trained{background:#c9f2d0;color:#0b4d1c}.t.trained.odd{background:#aee8b8}
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
  var names=%s, counts={tokens:0};
  names.forEach(function(n){counts[n]=0;});
  var tokens=document.querySelectorAll('#tokens .t');
  tokens.forEach(function(el){counts.tokens++; names.forEach(function(n){
    if(el.classList.contains(n)) counts[n]++;});});
  counts.rewrite_points=document.querySelectorAll('#tokens .marker.rewrite').length;
  var box=document.getElementById('js-counts');
  box.innerHTML='<span class="drawn">drawn on this page:</span>';
  Object.keys(counts).forEach(function(k){var s=document.createElement('span');
    s.id='js-count-'+k; s.innerHTML=k+' <b>'+counts[k]+'</b>'; box.appendChild(s);});
  document.body.setAttribute('data-js-counts', JSON.stringify(counts));
  var tip=document.getElementById('tip');
  document.getElementById('tokens').addEventListener('mousemove',function(e){
    var el=e.target; if(!el.classList||!el.classList.contains('t')){tip.style.display='none';return;}
    tip.textContent='#'+el.dataset.i+'  id '+el.dataset.id+'  '+el.dataset.c+
      (el.dataset.call?'  call '+el.dataset.call:'')+(el.dataset.lp?'  logprob '+el.dataset.lp:'');
    tip.style.left=(e.clientX+12)+'px'; tip.style.top=(e.clientY+12)+'px'; tip.style.display='block';
  });
})();
"""


def render_html(
    view: SampleView, texts: Sequence[str], *, source: str, ids_only: bool = False
) -> str:
    """The page for one sample; `texts` are the tokens' texts, or their ids (`ids_only`: then the
    tokens are spaced apart, since ids have no spacing of their own)."""
    sample = view.sample
    counts = view.counts()
    esc = html.escape
    meta = [
        ("sample", sample.sample_id),
        ("episode", sample.episode_id),
        ("agent", sample.agent or "-"),
        ("model", sample.model or "-"),
        ("task", sample.task_id or "-"),
        ("reward", "-" if sample.reward is None else f"{sample.reward:.6g}"),
        ("start reason", sample.start_reason),
        ("end reason", sample.end_reason),
        ("logprobs", "yes" if sample.logprobs is not None else "no"),
        ("file", source),
    ]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>tito-agents sample {esc(sample.sample_id)}</title><style>{_CSS}</style></head>",
        f"<body data-sample-id='{esc(sample.sample_id)}'>",
        f"<h1>Sample <code>{esc(sample.sample_id)}</code></h1><dl class='meta'>",
        *(f"<dt>{esc(k)}</dt><dd>{esc(str(v))}</dd>" for k, v in meta),
        "</dl><div id='counts'>",
        *(
            f"<span id='count-{k}' data-count='{v}'>{esc(_LABELS[k])} <b>{v}</b></span>"
            for k, v in counts.items()
        ),
        "</div><div id='js-counts'>(script did not run)</div>",
        _spans_table(view),
        "<p class='legend'>legend: <span class='t context'>context</span> "
        "<span class='t env'>tool / environment</span> <span class='t trained'>trained</span> "
        "<span class='marker rewrite'>⟂</span> rewrite point <span class='marker end'>⟂</span> "
        "end</p>",
        "<ul class='markers'>",
        *(
            f"<li><span class='marker {_marker_class(m.kind)}'>⟂</span> "
            f"@{m.position}: {esc(m.label)}</li>"
            for m in view.markers
        ),
        "</ul>",
        f"<div id='tokens'{' class=ids' if ids_only else ''}>{_token_spans(view, texts)}</div>",
        "<div id='tip'></div>",
        f"<script>{_JS % orjson.dumps(list(CLASS_NAMES)).decode()}</script></body></html>",
    ]
    return "".join(parts)


def _marker_class(kind: str) -> str:
    """`rewrite` for rewrite points (counted as such), else the marker's own kind."""
    return "rewrite" if kind in REWRITE_KINDS else kind


_LABELS = {
    "tokens": "tokens",
    "context": "context",
    "env": "tool/env",
    "trained": "trained",
    "calls": "calls",
    "rewrite_points": "rewrite points",
}


def _spans_table(view: SampleView) -> str:
    rows = []
    for k, span in enumerate(view.sample.spans):
        reward = "-" if span.reward is None else f"{span.reward:.6g}"
        cells = (
            k,
            span.call_id,
            f"{span.context_start}:{span.start}",
            f"{span.start}:{span.end}",
            span.finish_reason or "-",
            reward,
            span.policy_version or "-",
        )
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>" for h in ("#", "call", "context", "sampled", "finish", "reward", "policy")
    )
    return f"<table id='spans'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _token_spans(view: SampleView, texts: Sequence[str]) -> str:
    """One `<span class='t CLASS'>` per token, markers inserted before their position."""
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
    mask = sample.loss_mask.tolist()
    out: list[str] = []
    for i, text in enumerate(texts):
        out.extend(markers_at.get(i, ()))
        name = CLASS_NAMES[classes[i]]
        odd = " odd" if i % 2 else ""
        extra = f" data-call='{calls[i]}'" if calls[i] >= 0 else ""
        if logprobs is not None and mask[i]:
            extra += f" data-lp='{logprobs[i]:.4f}'"
        shown = html.escape(text).replace("\n", "↵\n")
        out.append(
            f"<span class='t {name}{odd}' data-i='{i}' data-id='{ids[i]}' data-c='{name}'{extra}>"
            f"{shown}</span>"
        )
    out.extend(markers_at.get(len(texts), ()))
    return "".join(out)

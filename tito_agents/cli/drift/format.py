"""The drift report as text: one table per measure, drift by kind, a few examples."""

from __future__ import annotations

from typing import Any

from tito_agents.cli._term import percent, table

__all__ = ["format_drift"]


def format_drift(data: dict[str, Any]) -> str:
    """The drift report as text: a table per measure, kinds, then a few examples."""
    calls, seqs, rer = data["calls"], data["sequences"], data["template_rerender"]
    samples = data["samples"]
    lines = [
        f"drift {data['file']}  (tokenizer {data['tokenizer']})",
        "",
        "decode -> encode of the ids the engine sampled, per call; of the whole sequence, per sample:",
        table(
            ("", "scanned", "drifted", "share", "tokens", "tokens affected", "share of tokens"),
            [
                (
                    "calls",
                    calls["scanned"],
                    calls["drifted"],
                    percent(calls["drifted"], calls["scanned"]),
                    calls["tokens"],
                    calls["tokens_affected"],
                    percent(calls["tokens_affected"], calls["tokens"]),
                ),
                (
                    "samples (any call)",
                    samples["scanned"],
                    samples["with_drifted_call"],
                    percent(samples["with_drifted_call"], samples["scanned"]),
                    "",
                    "",
                    "",
                ),
                (
                    "samples (whole sequence)",
                    seqs["scanned"],
                    seqs["drifted"],
                    percent(seqs["drifted"], seqs["scanned"]),
                    seqs["tokens"],
                    seqs["tokens_affected"],
                    percent(seqs["tokens_affected"], seqs["tokens"]),
                ),
            ],
        ),
    ]
    other_view = samples.get("other_view_left_out", 0)
    if other_view:
        lines.append(
            f'per-call and merged samples of the same calls (assembly="both"): each call counted '
            f"once, from the merged samples; {other_view:,} per-call samples left out"
        )
    kinds = [
        (f"{where}: {kind}", v["count"], v["tokens_affected"])
        for where, tally in (("call", calls), ("sequence", seqs), ("template", rer))
        for kind, v in tally["by_kind"].items()
    ]
    if kinds:
        lines += ["", "by kind:", table(("kind", "count", "tokens affected"), kinds, indent="  ")]
    lines.append("")
    template = data.get("chat_template")
    if template is None:
        lines.append(
            "template re-rendering: not measured (give --chat-template FILE, the template the "
            "server renders with, or --chat-template tokenizer for the tokenizer's own)"
        )
    elif rer["available"]:
        lines.append(
            f"template re-rendering of captured messages with {template}: {rer['drifted']:,} of "
            f"{rer['scanned']:,} prompts differ ({rer['tokens_affected']:,} tokens affected); "
            f"{rer['render_refused']:,} could not be rendered"
        )
    else:
        lines.append(
            "template re-rendering: not measured (these samples carry no captured messages: "
            "metadata['call_messages'], see docs/cli.md)"
        )
    for example in data["examples"]:
        lines.append(
            f"  e.g. {example['where']} {example['call_id']} of sample {example['sample_id']} at "
            f"token {example['position']}: captured {example['captured']!r} "
            f"re-encoded {example['re_encoded']!r}"
        )
    return "\n".join(lines)

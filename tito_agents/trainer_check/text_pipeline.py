"""The text pipeline, rebuilt for comparison: what a collector that keeps text instead of ids trains.

For each sample, the calls it holds are replayed as text, the way text-based collectors build a
training row: decode each call's sampled ids into the assistant message, re-render the whole
conversation with the chat template the server used, tokenize the result and set the loss on the
assistant turns (their content and end-of-turn token). This is the charitable version: the message
content is the exact decoded text, not a re-serialised tool call.

Its rollout logprobs are aligned by text, as such a collector aligns the per-token logprobs the
API returned with its own tokens: by byte offset inside each assistant turn. A re-tokenized token
that starts and ends where a sampled token did, with the same id, takes that token's logprob (and
counts as *matching*); any other one takes the summed logprobs of the sampled tokens that start
inside it (the joint logprob of a merge, the whole token's logprob on the first piece of a split,
0.0 on later pieces and on a template token the engine never sampled) and counts as *differing*.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from tito_agents.calls import Call
from tito_agents.samples import Sample

if TYPE_CHECKING:  # the codec (tokenizers) is only needed when a rebuild runs
    from tito_agents.token_codec import TokenCodec


class TextPipelineError(ValueError):
    """A sample cannot be rebuilt as text (its calls or messages were not kept)."""


@dataclass(frozen=True, slots=True)
class TextRow:
    """One sample rebuilt as text: the row a text pipeline would train on."""

    sample_id: str
    input_ids: npt.NDArray[np.int64]
    trained: npt.NDArray[np.int64]
    """Positions (unshifted) of the tokens with loss 1."""
    rollout: npt.NDArray[np.float64]
    """Text-aligned rollout logprob of each trained token."""
    matches: npt.NDArray[np.bool_]
    """Whether each trained token is exactly a sampled token (same id, same place in the text)."""
    constrained: npt.NDArray[np.bool_]
    """Whether each trained token lies in a call sampled under a constraint."""
    calls_drifted: int
    """Calls of this sample whose sampled text re-tokenizes to other ids than the engine's."""
    calls: int


def _sampled_text(codec: TokenCodec, call: Call, eos_ids: frozenset[int]) -> str:
    """The assistant content a text collector would keep: the sampled ids decoded, without the
    end-of-turn token (the template adds its own)."""
    ids = call.sampled_ids.tolist()
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    return codec.decode(ids, skip_special_tokens=False)


def _conversation(
    calls: Sequence[Call], texts: Sequence[str]
) -> tuple[list[dict[str, Any]], list[int]]:
    """The conversation with each call's reply as plain text, and the index of each reply.

    Each later call's request holds the earlier messages plus what the agent added (tool results,
    a user turn); only those additions are taken from it, so every assistant turn is the decoded
    text and never the agent's parsed copy.
    """
    conversation: list[dict[str, Any]] = []
    replies: list[int] = []
    previous = 0
    for call, text in zip(calls, texts, strict=True):
        if call.messages is None:
            raise TextPipelineError(f"call {call.call_id}: request messages were not kept")
        added = call.messages[previous:] if not replies else call.messages[previous + 1 :]
        conversation.extend(dict(m) for m in added)
        replies.append(len(conversation))
        conversation.append({"role": "assistant", "content": text})
        previous = len(call.messages)
    return conversation, replies


def _byte_starts(codec: TokenCodec, ids: Sequence[int]) -> npt.NDArray[np.int64]:
    """Byte offset of each token in the concatenated text, plus the total at the end."""
    sizes = np.fromiter((len(codec.token_bytes(i)) for i in ids), dtype=np.int64, count=len(ids))
    out = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def rebuild(
    sample: Sample,
    calls: Mapping[str, Call],
    codec: TokenCodec,
    *,
    eos_ids: frozenset[int],
    end_of_turn: str,
    constrained_calls: frozenset[str] = frozenset(),
) -> TextRow:
    """`sample` replayed through the text pipeline (see the module docstring)."""
    try:
        ordered = [calls[span.call_id] for span in sample.spans]
    except KeyError as exc:
        raise TextPipelineError(f"sample {sample.sample_id}: call {exc} was not kept") from None
    texts = [_sampled_text(codec, c, eos_ids) for c in ordered]
    conversation, replies = _conversation(ordered, texts)
    tools = ordered[0].tools
    full = codec.render_chat(
        conversation, tools, add_generation_prompt=False, continue_final_message=False
    )
    ids = codec.encode(full, add_special_tokens=False)
    starts = _byte_starts(codec, ids)
    if int(starts[-1]) != len(full.encode()):
        raise TextPipelineError(f"sample {sample.sample_id}: token bytes do not spell the text")

    trained: list[int] = []
    rollout: list[float] = []
    matches: list[bool] = []
    constrained: list[bool] = []
    drifted = 0
    for call, text, index in zip(ordered, texts, replies, strict=True):
        prefix = codec.render_chat(
            conversation[:index], tools, add_generation_prompt=True, continue_final_message=False
        )
        if not full.startswith(prefix + text):
            raise TextPipelineError(f"call {call.call_id}: the template does not keep the reply")
        lo = len(prefix.encode())
        hi = lo + len((text + end_of_turn).encode())
        sampled = call.sampled_ids.tolist()
        offsets = _byte_starts(codec, sampled)
        lps = np.zeros(len(sampled)) if call.logprobs is None else call.logprobs.astype(np.float64)
        by_start = {int(offsets[k]): k for k in range(len(sampled))}
        turn = [j for j in range(len(ids)) if lo <= starts[j] < hi]
        # Drift is about the sampled text; an end-of-turn token the template adds after a reply cut
        # by max_tokens differs too (it was never sampled) but is no re-tokenization.
        spelled = [ids[j] for j in turn if starts[j] - lo < offsets[-1]]
        drifted += spelled != sampled
        for j in turn:
            a, b = int(starts[j]) - lo, int(starts[j + 1]) - lo
            k = by_start.get(a)
            exact = k is not None and int(offsets[k + 1]) == b and sampled[k] == ids[j]
            inside = (offsets[:-1] >= a) & (offsets[:-1] < b)
            trained.append(j)
            rollout.append(float(lps[inside].sum()))
            matches.append(bool(exact))
            constrained.append(call.call_id in constrained_calls)
    return TextRow(
        sample_id=sample.sample_id,
        input_ids=np.asarray(ids, dtype=np.int64),
        trained=np.asarray(trained, dtype=np.int64),
        rollout=np.asarray(rollout, dtype=np.float64),
        matches=np.asarray(matches, dtype=np.bool_),
        constrained=np.asarray(constrained, dtype=np.bool_),
        calls_drifted=drifted,
        calls=len(ordered),
    )

"""What the fake vLLM's endpoints share: settings, prompt rendering, stop rules, small endpoints.

Chat (`_chat`) and completions (`_completions`) follow one path: resolve the prompt ids,
resolve the stop rules here, let the fake model sample every choice (`FakeModel.sample`), then
serialize the samples in the requested shape. Streams come from the same samples as bodies, one
chunk per sampled token, so streamed `token_ids` always concatenate to the non-stream ones.

The fault switches that change *what* vLLM would say (missing ids, nulls with
`include_reasoning=false`, lost parser chunks, mismatching lengths) travel as `WireFaults` into the
endpoints; those that change *how* bytes travel (latency, cuts, malformed framing) stay in
`_core`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tito_agents.testing.fake_vllm import _wire as wire
from tito_agents.testing.fake_vllm._codec import TokenCodec
from tito_agents.testing.fake_vllm._logprobs import LogprobModel, Scored, StepLogprobs
from tito_agents.testing.fake_vllm._model import FakeModel, StopRules
from tito_agents.testing.fake_vllm._requests import (
    ChatRequest,
    FakeHTTPError,
    SamplingRequest,
    bad_request,
    parse_chat,
    schema_error,
)

__all__ = [
    "DONE",
    "Engine",
    "EngineSettings",
    "Json",
    "Reply",
    "StreamEvent",
    "WireFaults",
    "conversation",
    "returned_ids",
    "round_robin",
    "strip_events",
    "strip_token_ids",
]

Json = dict[str, Any]
DONE = "[DONE]"
StreamEvent = Json | str
"""A chunk dict, or `DONE` for the `data: [DONE]` terminator."""


@dataclass(frozen=True)
class WireFaults:
    """The fault switches that change the content of responses (see `Faults` in fake_vllm)."""

    no_token_ids: bool = False
    include_reasoning_nulls: bool = False
    drop_parser_chunks: bool = False
    length_mismatch: bool = False


@dataclass(frozen=True)
class Reply:
    """A JSON body or, for `stream=true`, the SSE events (chunk dicts and `DONE`)."""

    status: int = 200
    body: Any = None
    events: list[StreamEvent] | None = None
    headers: tuple[tuple[str, str], ...] = ()
    named_events: bool = False
    """Each event goes out with an `event: <type>` line (the Responses API stream)."""


@dataclass(frozen=True)
class EngineSettings:
    model: str
    max_model_len: int
    system_fingerprint: str
    return_tokens_as_token_ids: bool
    created: int = field(default_factory=lambda: int(time.time()))


class Engine:
    """Everything the endpoints share: codec, fake model, logprob model and settings."""

    def __init__(self, codec: TokenCodec, model: FakeModel, settings: EngineSettings) -> None:
        self.codec = codec
        self.model = model
        self.settings = settings
        self.logprobs = LogprobModel(codec.vocab_size, codec.special_ids)

    # -- shared helpers ------------------------------------------------------------------------

    def check_model(self, requested: str | None) -> None:
        name = self.settings.model
        if requested is not None and requested != name:
            raise FakeHTTPError(
                404,
                f"The model `{requested}` does not exist. Valid aliases: {name}.",
                err_type="NotFoundError",
                param="model",
                suffix=False,
            )

    def stop_rules(
        self, sampling: SamplingRequest, prompt_len: int, *, skip_special_tokens: bool
    ) -> StopRules:
        """Resolve `max_tokens` against the context window, as vLLM's `get_max_tokens` does.

        A prompt that fills the window is an error; a `max_tokens` beyond what is left is not,
        it is cut to fit (generation then ends with "length" at the window's end).
        """
        limit = self.settings.max_model_len
        if prompt_len >= limit:
            shown = min(prompt_len, limit + 1)
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains at least {shown} input tokens, which exceeds this limit even without "
                "any output tokens. Please reduce the length of the input prompt.",
                "input_tokens",
                shown,
            )
        remaining = limit - prompt_len
        requested = sampling.max_tokens
        return StopRules(
            max_tokens=remaining if requested is None else min(requested, remaining),
            eos_id=self.model.eos_id,
            stop=sampling.stop,
            stop_token_ids=sampling.stop_token_ids,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            skip_special_tokens=skip_special_tokens,
            ignore_eos=sampling.ignore_eos,
        )

    def as_token_ids(self, sampling: SamplingRequest) -> bool:
        flag = sampling.return_tokens_as_token_ids
        return self.settings.return_tokens_as_token_ids if flag is None else flag

    def score_sampled(
        self, prompt_ids: Sequence[int], token_ids: Sequence[int], top_k: int
    ) -> list[Scored]:
        """Logprobs of generated ids, each with `top_k` alternatives and contextual texts."""
        steps = self.logprobs.sampled(prompt_ids, token_ids, top_k)
        return self._decoded(prompt_ids, token_ids, steps)

    def score_prompt(self, prompt_ids: Sequence[int], top_k: int) -> list[Scored]:
        """`prompt_logprobs` positions (the first one without a step), with contextual texts."""
        return self._decoded((), prompt_ids, self.logprobs.prompt(prompt_ids, top_k))

    def _decoded(
        self,
        context_ids: Sequence[int],
        token_ids: Sequence[int],
        steps: Sequence[StepLogprobs | None],
    ) -> list[Scored]:
        rows = [
            (token_id, [token_id] if step is None else [t for t, _ in step.ranked])
            for token_id, step in zip(token_ids, steps, strict=True)
        ]
        texts = self.codec.logprob_texts(context_ids, rows)
        return [
            Scored(token_id, step, names)
            for token_id, step, names in zip(token_ids, steps, texts, strict=True)
        ]

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{secrets.token_hex(8)}"

    # -- prompt rendering and the small endpoints ----------------------------------------------

    def render_chat(self, request: ChatRequest) -> str:
        """The chat prompt text for a validated request, as vLLM renders it. A template that
        raises (jinja's `raise_exception`, an undefined name) is a 400, as in vLLM's frontend."""
        import jinja2

        try:
            return self.codec.render_chat(
                conversation(request.messages),
                list(request.tools) or None,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                template_kwargs=request.template_kwargs,
            )
        except jinja2.TemplateError as exc:
            raise bad_request(str(exc), None) from exc

    def tokenize(self, body: dict[str, Any]) -> Reply:
        """`POST /tokenize`: chat form (`messages`) or prompt form (`prompt`)."""
        self.check_model(body.get("model") if isinstance(body.get("model"), str) else None)
        if "messages" in body:
            request = parse_chat(
                {k: v for k, v in body.items() if k not in ("stream", "stream_options")},
                max_model_len=self.settings.max_model_len,
                vocab_size=self.codec.vocab_size,
            )
            ids = self.codec.encode(
                self.render_chat(request), add_special_tokens=request.add_special_tokens
            )
        elif isinstance(body.get("prompt"), str):
            ids = self.codec.encode(
                body["prompt"], add_special_tokens=body.get("add_special_tokens", True) is not False
            )
        else:
            raise bad_request("`/tokenize` needs `messages` or a string `prompt`.", "prompt")
        strs = [self.codec.token_piece(i) for i in ids] if body.get("return_token_strs") else None
        return Reply(
            body={
                "count": len(ids),
                "max_model_len": self.settings.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    def detokenize(self, body: dict[str, Any]) -> Reply:
        """`POST /detokenize`: special tokens are kept in the text."""
        self.check_model(body.get("model") if isinstance(body.get("model"), str) else None)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(_is_count(t) for t in tokens):
            raise schema_error("list_type", "body.tokens", "Input should be a valid list", tokens)
        known = [t for t in tokens if self.codec.is_valid_id(t)]  # vLLM drops unknown ids
        return Reply(body={"prompt": self.codec.decode(known, skip_special_tokens=False)})

    def models(self) -> Reply:
        settings = self.settings
        permission = f"modelperm-{secrets.token_hex(8)}"
        return Reply(
            body=wire.models_body(
                settings.model, settings.max_model_len, settings.created, permission
            )
        )


def conversation(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as vLLM hands them to the template: text parts joined, tool arguments as dicts."""
    rendered = []
    for message in messages:
        item = dict(message)
        content = item.get("content")
        if isinstance(content, list):
            item["content"] = "\n".join(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, dict) and "text" in part
            )
        if item.get("role") == "assistant" and isinstance(item.get("tool_calls"), list):
            item["tool_calls"] = [_parsed_arguments(call) for call in item["tool_calls"]]
        rendered.append(item)
    return rendered


def _parsed_arguments(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        with contextlib.suppress(ValueError):
            function["arguments"] = json.loads(function["arguments"])
    return {**call, "function": function}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def returned_ids(
    ids: list[int], *, enabled: bool, final: bool, faults: WireFaults
) -> list[int] | None:
    """`token_ids` as sent: None unless requested; `length_mismatch` drops the final chunk's last id."""
    if not enabled:
        return None
    return ids[:-1] if final and faults.length_mismatch else ids


def round_robin(per_choice: list[list[Json]]) -> Iterator[Json]:
    """Interleave the choices' chunks step by step, as the engine emits n>1 outputs."""
    for group in itertools.zip_longest(*per_choice):
        yield from (chunk for chunk in group if chunk is not None)


def strip_events(events: list[StreamEvent]) -> list[StreamEvent]:
    return [strip_token_ids(e) if isinstance(e, dict) else e for e in events]


def strip_token_ids(event: Json) -> Json:
    """The `no_token_ids` fault: remove the id fields, as a server older than 0.10.2 would."""
    stripped = {k: v for k, v in event.items() if k != "prompt_token_ids"}
    if isinstance(event.get("choices"), list):
        stripped["choices"] = [
            {k: v for k, v in choice.items() if k not in ("token_ids", "prompt_token_ids")}
            for choice in event["choices"]
        ]
    return stripped

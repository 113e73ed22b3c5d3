"""Request parsing and validation of the fake vLLM: JSON bodies in, resolved typed requests out.

Mirrors vLLM 0.32's request models where clients can observe it: unknown fields are ignored, the
documented defaults apply (`max_tokens` 16 on completions, `tool_choice` "auto" when tools are
given), and validation errors carry the messages a real vLLM 0.32 gives (checked against one):
vLLM's own checks as `"... (parameter=top_logprobs)"`, schema errors in pydantic's style
(`"1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', ...}"`). Values are coerced
leniently like pydantic's lax mode (`"2"` is a valid `n`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tito_agents.testing.fake_vllm._fields import (
    FakeHTTPError,
    bad_request,
    bool_field,
    int_field,
    int_list_field,
    number_field,
    optional_bool_field,
    schema_error,
)

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "FakeHTTPError",
    "SamplingRequest",
    "StreamOptions",
    "bad_request",
    "check_responses",
    "parse_chat",
    "parse_completion",
    "parse_json_object",
    "schema_error",
]

_MAX_LOGPROBS = 20
_GREEDY_EPSILON = 1e-5
"""vLLM treats a temperature below this as greedy sampling."""


@dataclass(frozen=True)
class StreamOptions:
    include_usage: bool = False
    continuous_usage_stats: bool = False


@dataclass(frozen=True)
class SamplingRequest:
    """Fields chat and completions share."""

    body: Mapping[str, Any]
    model: str | None
    n: int
    max_tokens: int | None
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: frozenset[int]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    ignore_eos: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool | None
    prompt_logprobs: int | None
    echo: bool
    stream: bool
    stream_options: StreamOptions


@dataclass(frozen=True)
class ChatRequest:
    sampling: SamplingRequest
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    tool_choice: str | Mapping[str, Any]
    logprobs: bool
    top_logprobs: int
    add_generation_prompt: bool
    continue_final_message: bool
    template_kwargs: Mapping[str, Any]
    include_reasoning: bool
    return_prompt_text: bool
    add_special_tokens: bool
    token_in: tuple[int, ...] | None
    """`kv_transfer_params.prompt_token_ids`: replaces the rendered prompt (vLLM 0.32 token-in)."""

    @property
    def tools_active(self) -> bool:
        """Whether the hermes parser runs: tools given and `tool_choice` is not "none"."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def named_tool(self) -> str | None:
        if isinstance(self.tool_choice, Mapping):
            return str((self.tool_choice.get("function") or {}).get("name"))
        return None

    @property
    def constrained(self) -> bool:
        """Whether vLLM samples this request through a grammar mask: a forced tool choice or a
        structured output (`response_format` json, `structured_outputs`, `guided_*`)."""
        if self.tools and (self.tool_choice == "required" or self.named_tool):
            return True
        body = self.sampling.body
        fmt = body.get("response_format")
        if isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object"):
            return True
        return bool(body.get("structured_outputs")) or any(
            body.get(k) is not None for k in ("guided_json", "guided_regex", "guided_choice")
        )


@dataclass(frozen=True)
class CompletionRequest:
    sampling: SamplingRequest
    prompts: tuple[str | tuple[int, ...], ...]
    logprobs: int | None
    add_special_tokens: bool


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object (FastAPI's and pydantic's errors otherwise)."""
    if not raw:
        raise schema_error("missing", "body", "Field required", None)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            json.loads(raw)
        except json.JSONDecodeError as exc:
            ctx = {"error": exc.msg}
            raise schema_error(
                "json_invalid", f"body.{exc.pos}", "JSON decode error", {}, ctx
            ) from exc
        raise schema_error("json_invalid", "body", "JSON decode error", {}) from None
    if not isinstance(body, dict):
        raise schema_error(
            "model_attributes_type",
            "body",
            "Input should be a valid dictionary or object to extract fields from",
            body,
        )
    return body


def parse_chat(body: dict[str, Any], *, max_model_len: int, vocab_size: int) -> ChatRequest:
    """Validate a `/v1/chat/completions` body (also the chat form of `/tokenize`)."""
    messages = _messages(body)
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    logprobs = bool_field(body, "logprobs", False)
    top_logprobs = int_field(body, "top_logprobs", None)
    if top_logprobs is not None and (top_logprobs > 0 or top_logprobs == -1) and not logprobs:
        raise bad_request(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )
    _check_logprobs_count(top_logprobs)
    add_generation_prompt = bool_field(body, "add_generation_prompt", True)
    continue_final_message = bool_field(body, "continue_final_message", False)
    if add_generation_prompt and continue_final_message:
        raise FakeHTTPError(
            400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    requested = int_field(body, "max_completion_tokens", None)
    requested = requested if requested is not None else int_field(body, "max_tokens", None)
    sampling = _sampling(body, requested, max_model_len=max_model_len)
    kwargs = body.get("chat_template_kwargs")
    return ChatRequest(
        sampling=sampling,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=kwargs if isinstance(kwargs, dict) else {},
        include_reasoning=bool_field(body, "include_reasoning", True),
        return_prompt_text=bool_field(body, "return_prompt_text", False),
        add_special_tokens=bool_field(body, "add_special_tokens", False),
        token_in=None if sampling.echo else _token_in(body.get("kv_transfer_params"), vocab_size),
    )


def parse_completion(
    body: dict[str, Any], *, max_model_len: int, vocab_size: int
) -> CompletionRequest:
    """Validate a `/v1/completions` body."""
    prompts = _prompts(body.get("prompt"), vocab_size)
    logprobs = int_field(body, "logprobs", None)
    _check_logprobs_count(logprobs)
    requested = int_field(body, "max_tokens", 16)
    return CompletionRequest(
        sampling=_sampling(body, requested, max_model_len=max_model_len),
        prompts=prompts,
        logprobs=logprobs,
        add_special_tokens=bool_field(body, "add_special_tokens", True),
    )


def _sampling(
    body: dict[str, Any], max_tokens: int | None, *, max_model_len: int
) -> SamplingRequest:
    if max_tokens is not None and max_tokens > max_model_len:
        raise bad_request(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            "Please request fewer output tokens.",
            "max_tokens",
            max_tokens,
        )
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens
        )
    n = int_field(body, "n", 1)
    n = 1 if n is None else n
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.", "n", n)
    temperature = number_field(body, "temperature", 1.0)
    if n > 1 and temperature < _GREEDY_EPSILON:
        raise FakeHTTPError(400, f"n must be 1 when using greedy sampling, got {n}.")
    stream = bool_field(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    prompt_logprobs = int_field(body, "prompt_logprobs", None)
    if prompt_logprobs is not None and stream:
        raise bad_request(
            "`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs"
        )
    model = body.get("model")
    return SamplingRequest(
        body=body,
        model=model if isinstance(model, str) else None,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=int_field(body, "seed", None),
        stop=_stop(body.get("stop")),
        stop_token_ids=frozenset(int_list_field(body, "stop_token_ids")),
        include_stop_str_in_output=bool_field(body, "include_stop_str_in_output", False),
        skip_special_tokens=bool_field(body, "skip_special_tokens", True),
        ignore_eos=bool_field(body, "ignore_eos", False),
        return_token_ids=bool_field(body, "return_token_ids", False),
        return_tokens_as_token_ids=optional_bool_field(body, "return_tokens_as_token_ids"),
        prompt_logprobs=prompt_logprobs,
        echo=bool_field(body, "echo", False),
        stream=stream,
        stream_options=_stream_options(options),
    )


def _stream_options(options: Any) -> StreamOptions:
    if not isinstance(options, dict):
        return StreamOptions()
    return StreamOptions(
        include_usage=bool_field(options, "include_usage", False, loc="body.stream_options"),
        continuous_usage_stats=bool_field(
            options, "continuous_usage_stats", False, loc="body.stream_options"
        ),
    )


def _check_logprobs_count(count: int | None) -> None:
    if count is not None and count > _MAX_LOGPROBS:
        raise bad_request(
            f"Requested sample logprobs of {count}, which is greater than max allowed: "
            f"{_MAX_LOGPROBS}",
            "logprobs",
            count,
        )


def _messages(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    if "messages" not in body:
        raise schema_error("missing", "body.messages", "Field required", body)
    messages = body["messages"]
    if not isinstance(messages, list):
        raise schema_error("list_type", "body.messages", "Input should be a valid list", messages)
    if not messages:
        raise FakeHTTPError(
            400,
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
        )
    for position, message in enumerate(messages):
        if not isinstance(message, dict):
            loc = f"body.messages.{position}"
            msg = "Input should be a valid dictionary"
            raise schema_error("dict_type", loc, msg, message)
    return tuple(messages)


def _tools(value: Any) -> tuple[Mapping[str, Any], ...]:
    """Tools as vLLM hands them to the chat template: `model_dump()` of its pydantic models.

    That fixes the key order (`type`, `function{name, description, parameters}`), fills missing
    `description`/`parameters` with null, keeps `strict`/`defer_loading` only when set, and drops
    unknown keys.
    """
    if value is None:
        return ()
    if not isinstance(value, list):
        raise schema_error("list_type", "body.tools", "Input should be a valid list", value)
    normalised = []
    for position, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            loc = f"body.tools.{position}.function.name"
            raise schema_error("missing", loc, "Field required", function)
        dumped: dict[str, Any] = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        for optional in ("strict", "defer_loading"):
            if function.get(optional) is not None:
                dumped[optional] = function[optional]
        normalised.append({"type": tool.get("type", "function"), "function": dumped})
    return tuple(normalised)


def _tool_choice(value: Any, tools: Sequence[Mapping[str, Any]]) -> str | Mapping[str, Any]:
    if value is None:
        return "auto" if tools else "none"
    if value == "none":
        return "none"
    if not tools:
        raise bad_request("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if value in ("auto", "required"):
        return str(value)
    name = (value.get("function") or {}).get("name") if isinstance(value, dict) else None
    if not isinstance(name, str):
        raise schema_error("union_tag_invalid", "body.tool_choice", "Invalid tool_choice", value)
    if not any(t["function"]["name"] == name for t in tools):
        raise bad_request(
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            "tool_choice",
        )
    return dict(value)


def check_responses(body: Mapping[str, Any]) -> None:
    """The types of the Responses fields capture reads (vLLM's `ResponsesRequest`)."""
    bool_field(body, "enable_response_messages", False)
    bool_field(body, "stream", False)
    int_field(body, "top_logprobs", None)
    include = body.get("include")
    if include is not None and not isinstance(include, list):
        raise schema_error("list_type", "body.include", "Input should be a valid list", include)


def _token_in(value: Any, vocab_size: int) -> tuple[int, ...] | None:
    if value is not None and not isinstance(value, dict):
        msg = "Input should be a valid dictionary"
        raise schema_error("dict_type", "body.kv_transfer_params", msg, value)
    if value is None or "prompt_token_ids" not in value:
        return None
    ids = value["prompt_token_ids"]
    param = "kv_transfer_params.prompt_token_ids"
    if not isinstance(ids, list) or not ids or not all(_is_count(t) for t in ids):
        raise bad_request(
            "`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative "
            "integers.",
            param,
        )
    _check_vocabulary(ids, vocab_size, param)
    return tuple(ids)


def _prompts(value: Any, vocab_size: int) -> tuple[str | tuple[int, ...], ...]:
    if not value:
        raise bad_request(
            "Either prompt or prompt_embeds must be provided and non-empty.", "prompt"
        )
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(p, str) for p in value):
        return tuple(value)
    if isinstance(value, list) and all(_is_count(t) for t in value):
        _check_vocabulary(value, vocab_size, None)
        return (tuple(value),)
    nested = isinstance(value, list) and all(isinstance(p, list) and p for p in value)
    if nested and all(_is_count(t) for p in value for t in p):
        for prompt in value:
            _check_vocabulary(prompt, vocab_size, None)
        return tuple(tuple(p) for p in value)
    raise schema_error(
        "union_type",
        "body.prompt",
        "Input should be a string, a list of strings, or a list of token ids",
        value,
    )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_vocabulary(ids: Sequence[int], vocab_size: int, param: str | None) -> None:
    for token_id in ids:
        if token_id >= vocab_size:
            raise bad_request(f"Token id {token_id} is out of vocabulary", param)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise schema_error("union_type", "body.stop", "Input should be a string or a list", value)

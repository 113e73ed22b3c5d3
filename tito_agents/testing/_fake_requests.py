"""Request parsing and validation of the fake vLLM: JSON bodies in, resolved typed requests out.

Mirrors vLLM 0.32's request models where clients can observe it: unknown fields are ignored, the
documented defaults apply (`max_tokens` 16 on completions, `tool_choice` "auto" when tools are
given), and the validation errors tests rely on are raised with vLLM's nested error body and
message style (`"... (parameter=top_logprobs)"`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "FakeHTTPError",
    "SamplingRequest",
    "StreamOptions",
    "parse_chat",
    "parse_completion",
    "parse_json_object",
]

_MISSING: Any = object()


class FakeHTTPError(Exception):
    """An error the fake answers with vLLM's body `{"error": {"message","type","param","code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        err_type: str = "BadRequestError",
        param: str | None = None,
        value: Any = _MISSING,
        suffix: bool = True,
    ) -> None:
        if suffix and param is not None:
            detail = (
                f"parameter={param}" if value is _MISSING else f"parameter={param}, value={value}"
            )
            message = f"{message} ({detail})"
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


def bad_request(message: str, param: str | None = None, value: Any = _MISSING) -> FakeHTTPError:
    return FakeHTTPError(400, message, param=param, value=value)


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


@dataclass(frozen=True)
class CompletionRequest:
    sampling: SamplingRequest
    prompts: tuple[str | tuple[int, ...], ...]
    logprobs: int | None
    add_special_tokens: bool


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def parse_chat(body: dict[str, Any], *, max_model_len: int, vocab_size: int) -> ChatRequest:
    """Validate a `/v1/chat/completions` body."""
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or not messages
        or not all(isinstance(m, dict) for m in messages)
    ):
        raise bad_request("`messages` must be a non-empty list of message objects.", "messages")
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    logprobs = _bool(body, "logprobs", False)
    top_logprobs = _int(body, "top_logprobs", None)
    if top_logprobs is not None and (top_logprobs > 0 or top_logprobs == -1) and not logprobs:
        raise bad_request(
            "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
        )
    add_generation_prompt = _bool(body, "add_generation_prompt", True)
    continue_final_message = _bool(body, "continue_final_message", False)
    if add_generation_prompt and continue_final_message:
        raise FakeHTTPError(
            400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    requested = _int(body, "max_completion_tokens", None)
    requested = requested if requested is not None else _int(body, "max_tokens", None)
    sampling = _sampling(body, requested, max_model_len=max_model_len)
    kwargs = body.get("chat_template_kwargs")
    return ChatRequest(
        sampling=sampling,
        messages=tuple(messages),
        tools=tools,
        tool_choice=tool_choice,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=kwargs if isinstance(kwargs, dict) else {},
        include_reasoning=_bool(body, "include_reasoning", True),
        return_prompt_text=_bool(body, "return_prompt_text", False),
        add_special_tokens=_bool(body, "add_special_tokens", False),
        token_in=None if sampling.echo else _token_in(body.get("kv_transfer_params"), vocab_size),
    )


def parse_completion(
    body: dict[str, Any], *, max_model_len: int, vocab_size: int
) -> CompletionRequest:
    """Validate a `/v1/completions` body."""
    prompts = _prompts(body.get("prompt", _MISSING), vocab_size)
    logprobs = _int(body, "logprobs", None)
    if logprobs is not None and logprobs < 0:
        raise bad_request("`logprobs` must be a non-negative integer.", "logprobs", logprobs)
    requested = _int(body, "max_tokens", 16)
    return CompletionRequest(
        sampling=_sampling(body, requested, max_model_len=max_model_len),
        prompts=prompts,
        logprobs=logprobs,
        add_special_tokens=_bool(body, "add_special_tokens", True),
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
    n = _int(body, "n", 1) or 1
    if n < 1:
        raise bad_request("n must be at least 1.", "n", n)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request(
            "Stream options can only be defined when `stream=True`.", "stream_options"
        )
    prompt_logprobs = _int(body, "prompt_logprobs", None)
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
        temperature=float(_number(body, "temperature", 1.0)),
        seed=_int(body, "seed", None),
        stop=_stop(body.get("stop")),
        stop_token_ids=frozenset(_int_list(body, "stop_token_ids")),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False),
        skip_special_tokens=_bool(body, "skip_special_tokens", True),
        ignore_eos=_bool(body, "ignore_eos", False),
        return_token_ids=_bool(body, "return_token_ids", False),
        return_tokens_as_token_ids=_optional_bool(body, "return_tokens_as_token_ids"),
        prompt_logprobs=prompt_logprobs,
        echo=_bool(body, "echo", False),
        stream=stream,
        stream_options=StreamOptions(
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            continuous_usage_stats=bool(
                isinstance(options, dict) and options.get("continuous_usage_stats")
            ),
        ),
    )


def _tools(value: Any) -> tuple[Mapping[str, Any], ...]:
    """Tools as vLLM hands them to the chat template: `model_dump()` of its pydantic models.

    That fixes the key order (`type`, `function{name, description, parameters}`), fills missing
    `description`/`parameters` with null, keeps `strict`/`defer_loading` only when set, and drops
    unknown keys.
    """
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise bad_request("`tools` must be a list of tool objects.", "tools")
    normalised = []
    for tool in value:
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request("Each tool needs `function.name`.", "tools")
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
    if value in ("none", "auto", "required"):
        if value != "none" and not tools:
            raise bad_request(
                f'When using `tool_choice` "{value}", `tools` must be set.', "tool_choice"
            )
        return str(value)
    if isinstance(value, dict) and isinstance((value.get("function") or {}).get("name"), str):
        name = value["function"]["name"]
        if not any(t["function"]["name"] == name for t in tools):
            raise bad_request(f"Tool '{name}' has not been passed in `tools`.", "tool_choice")
        return value
    raise bad_request("Invalid `tool_choice`.", "tool_choice")


def _token_in(value: Any, vocab_size: int) -> tuple[int, ...] | None:
    if not isinstance(value, dict) or "prompt_token_ids" not in value:
        return None
    ids = value["prompt_token_ids"]
    valid = isinstance(ids, list) and ids and all(_is_token(t, vocab_size) for t in ids)
    if not valid:
        raise bad_request(
            "`kv_transfer_params.prompt_token_ids` must be a non-empty list of token ids in "
            f"[0, {vocab_size}).",
            "kv_transfer_params.prompt_token_ids",
        )
    return tuple(ids)


def _prompts(value: Any, vocab_size: int) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value:
        if all(isinstance(p, str) for p in value):
            return tuple(value)
        if all(_is_token(t, vocab_size) for t in value):
            return (tuple(value),)
        if all(
            isinstance(p, list) and p and all(_is_token(t, vocab_size) for t in p) for p in value
        ):
            return tuple(tuple(p) for p in value)
    raise bad_request(
        "`prompt` must be a string, a list of strings, a list of token ids or a list of lists of "
        "token ids.",
        "prompt",
    )


def _is_token(value: Any, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(s for s in value if s)
    raise bad_request("`stop` must be a string or a list of strings.", "stop")


def _bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"`{key}` must be a boolean.", key, value)
    return value


def _optional_bool(body: Mapping[str, Any], key: str) -> bool | None:
    return None if body.get(key) is None else _bool(body, key, False)


def _int(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"`{key}` must be an integer.", key, value)
    return value


def _number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad_request(f"`{key}` must be a number.", key, value)
    return float(value)


def _int_list(body: Mapping[str, Any], key: str) -> list[int]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise bad_request(f"`{key}` must be a list of integers.", key)
    return list(value)

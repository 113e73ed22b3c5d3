"""vLLM 0.32's own Anthropic Messages conversions, run in the vLLM venv (not in the test process).

Reads one JSON document on stdin, `{"requests": [...], "responses": [...], "streams": [...]}`, and
writes one JSON document with vLLM's answer for each case:

* a request case `{"payload", "merge", "effort", "mine"}`: `AnthropicMessagesRequest` validation
  and `to_chat_completion_request` of `payload` (`{"refused": why}` or `{"dump", "set"}`), and
  `ChatCompletionRequest.model_validate(mine)` (what the chat endpoint reads from capture's
  conversion), dumped the same way; `request_id` (random) is left out;
* a response case (a chat completion body): `messages_full_converter`, rendered as the router
  renders it (`{"status", "body"}`, errors translated as `translate_error_response` does);
* a stream case (a list of chat chunks): `message_stream_converter` over `data: ...` lines and a
  final `data: [DONE]`, the events as the text vLLM sends.

Thinking signatures (random `uuid4().hex`) are replaced by "SIG".
Usage: ~/.cache/tito-agents/vllm-venv/bin/python tests/support/vllm_anthropic_oracle.py < cases
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import warnings
from collections.abc import AsyncIterator
from typing import Any

warnings.simplefilter("ignore")

from vllm.entrypoints.anthropic.protocol import (  # noqa: E402
    AnthropicError,
    AnthropicErrorResponse,
    AnthropicMessagesRequest,
)
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages as Serving  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import (  # noqa: E402
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.serve.exception_handling.error_response import (  # noqa: E402
    create_error_response,
)

_SIGNATURE = re.compile(r'"signature":"[0-9a-f]{32}"')


def _dump(request: ChatCompletionRequest) -> dict[str, Any]:
    fields = sorted(request.model_fields_set - {"request_id"})
    return {"dump": request.model_dump(mode="json", exclude={"request_id"}), "set": fields}


def _request(case: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        request = AnthropicMessagesRequest.model_validate(case["payload"])
        chat = Serving.to_chat_completion_request(
            request,
            merge_inline_system=case["merge"],
            disabled_thinking_effort=case["effort"],
        )
        out["vllm"] = _dump(chat)
    except Exception as error:  # the server answers an error
        out["vllm"] = {"refused": f"{type(error).__name__}: {error}"[:300]}
    if isinstance(case.get("mine"), dict):
        try:
            out["mine"] = _dump(ChatCompletionRequest.model_validate(case["mine"]))
        except Exception as error:
            out["mine"] = {"refused": f"{type(error).__name__}: {error}"[:300]}
    return out


def _render(content: Any) -> str:
    text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _SIGNATURE.sub('"signature":"SIG"', text)


def _response(body: dict[str, Any]) -> dict[str, Any]:
    response = ChatCompletionResponse.model_validate(body)
    try:
        message = Serving.messages_full_converter(None, response)
    except Exception as error:
        info = create_error_response(error).error
        wire = AnthropicErrorResponse(error=AnthropicError(type=info.type, message=info.message))
        return {"status": info.code, "body": json.loads(_render(wire.model_dump()))}
    return {"status": 200, "text": _render(message.model_dump(exclude_none=True))}


async def _lines(chunks: list[Any]) -> AsyncIterator[str]:
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'))}\n\n"
    yield "data: [DONE]\n\n"


async def _stream(chunks: list[Any]) -> str:
    events = [event async for event in Serving.message_stream_converter(None, _lines(chunks))]
    return _SIGNATURE.sub('"signature":"SIG"', "".join(events))


def main() -> None:
    cases = json.load(sys.stdin)
    result = {
        "requests": [_request(case) for case in cases.get("requests", [])],
        "responses": [_response(body) for body in cases.get("responses", [])],
        "streams": [asyncio.run(_stream(chunks)) for chunks in cases.get("streams", [])],
    }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()

"""Which requests vLLM samples through a grammar mask (`constraint_of`), and the request rewrite
records it without changing what is sent."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tito_agents._capture.wire.request import constraint_of, prepare_request
from tito_agents.calls import Endpoint

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        ({}, None),
        ({"tools": TOOLS}, None),
        ({"tools": TOOLS, "tool_choice": "auto"}, None),
        ({"tools": TOOLS, "tool_choice": "none"}, None),
        ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice=required"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice=named",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "f"}}, "tool_choice=named"),
        ({"tool_choice": "required"}, None),  # no tools: vLLM has nothing to force
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": SCHEMA}, "response_format=json_schema"),
        ({"response_format": {"type": "json_object"}}, "response_format=json_object"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format=json_schema"),
        ({"text": {"format": {"type": "text"}}}, None),
        ({"structured_outputs": {"regex": "[ab]+"}}, "structured_outputs=regex"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "structured_outputs=choice"),
        (
            {"structured_outputs": {"json": {}, "disable_any_whitespace": True}},
            "structured_outputs=json",
        ),
        ({"structured_outputs": {"disable_fallback": True}}, None),
        ({"structured_outputs": {}}, None),
        ({"guided_json": {"type": "object"}}, "guided_json"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"guided_choice": ["a"]}, "guided_choice"),
        ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
        ({"response_format": "json"}, None),  # malformed: not a constraint vLLM would apply
    ],
)
def test_constraint_of(payload: dict[str, Any], kind: str | None) -> None:
    assert constraint_of(payload) == kind


def test_prepare_request_records_the_constraint_and_sends_the_callers_fields() -> None:
    body = orjson.dumps(
        {"model": "m", "messages": [], "tools": TOOLS, "tool_choice": "required", "n": 2}
    )
    prepared = prepare_request(Endpoint.CHAT, body, capture_logprobs=False)
    assert prepared is not None
    new_body, info = prepared
    assert info.constrained == "tool_choice=required"
    sent = orjson.loads(new_body or body)
    assert sent["tool_choice"] == "required" and sent["return_token_ids"] is True
    free = prepare_request(
        Endpoint.COMPLETIONS, b'{"model":"m","prompt":"x"}', capture_logprobs=False
    )
    assert free is not None and free[1].constrained is None

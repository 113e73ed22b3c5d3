"""The gateway's path allow-list, without a server: which raw request paths are refused (400,
414), which are outside the model routes (404, 405), and what is forwarded upstream."""

from __future__ import annotations

import pytest

from tito_agents.gateway._routes import (
    MAX_PATH_BYTES,
    MODEL_ROUTES,
    ModelCall,
    Refused,
    check_query,
    check_raw_path,
    model_call,
)

PREFIXES = [b"/v1", b"/episodes/ep-1/v1", b"/episodes/ep-1/agents/solver/v1"]

TRICKS = [
    b"/../../sleep",
    b"/../sleep",
    b"/..%2F..%2Fsleep",
    b"/..%2f..%2fsleep",
    b"/%2e%2e/%2e%2e/metrics",
    b"/%2E%2E/%2E%2E/metrics",
    b"/%2E./sleep",
    b"/.%2e/sleep",
    b"/./chat/completions",
    b"/chat/./completions",
    b"/chat/completions/../../../sleep",
    b"/chat%2Fcompletions",
    b"/..%5Csleep",
    b"/..\\sleep",
    b"//chat/completions",
    b"/chat//completions",
    b"/chat/completions/",
    b"/chat/completions%00",
    b"/chat/completions\x00",
    b"/chat/completions%0a",
    b"/%252e%252e/sleep",
    b"/%c0%ae%c0%ae/sleep",
    b"/chat/completions\xef\xbc\x8e",
    b"/chat%2",
    b"/ chat/completions",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("trick", TRICKS)
def test_path_tricks_are_refused_before_decoding(prefix: bytes, trick: bytes) -> None:
    """Dot segments, encoded separators, dots, NUL and control bytes, backslashes, empty
    segments, double encoding and overlong or raw non-ASCII bytes: 400, on every URL form."""
    refused = check_raw_path(prefix + trick)
    assert isinstance(refused, Refused) and refused.status == 400


@pytest.mark.parametrize(
    "raw",
    [b"http://127.0.0.1:9/v1/chat/completions", b"*", b"", b"v1/chat/completions"],
)
def test_a_target_that_is_not_an_origin_path_is_refused(raw: bytes) -> None:
    """Absolute-form (`POST http://host/...`), asterisk-form and relative targets: 400."""
    refused = check_raw_path(raw)
    assert isinstance(refused, Refused) and refused.status == 400


def test_an_overlong_path_is_refused() -> None:
    """Longer than MAX_PATH_BYTES: 414; one byte shorter is a plain (unlisted) path."""
    assert check_raw_path(b"/v1/" + b"a" * MAX_PATH_BYTES) == Refused(
        414, f"the request path is longer than {MAX_PATH_BYTES} bytes"
    )
    assert check_raw_path(b"/v1/" + b"a" * (MAX_PATH_BYTES - 4)) is None


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_model_routes_are_forwarded_as_received(prefix: bytes) -> None:
    """Each allow-listed route, on each URL form, goes upstream as `/v1/<route>`."""
    episode = None if prefix == b"/v1" else "ep-1"
    agent = "solver" if b"agents" in prefix else None
    for route, methods in MODEL_ROUTES.items():
        route = route.replace("{id}", "SmolLM2-135M-Instruct")
        raw = prefix + b"/" + route.encode()
        assert check_raw_path(raw) is None
        for method in methods:
            assert model_call(method, raw) == ModelCall(f"/v1/{route}", episode, agent)


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize(
    "route",
    [
        b"/sleep",
        b"/load_lora_adapter",
        b"/unload_lora_adapter",
        b"/embeddings",
        b"/chat/completions/render",
        b"/messages/render",
        b"/messages/batches",
        b"/responses/resp-1",
        b"/models/org/name",
        b"/chat",
        b"",
    ],
)
def test_routes_off_the_list_are_not_forwarded(prefix: bytes, route: bytes) -> None:
    """Anything else under `v1/`, for both methods: 404."""
    for method in ("GET", "POST"):
        refused = model_call(method, prefix + route)
        assert isinstance(refused, Refused) and refused.status == 404


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "OPTIONS", "DELETE", "PATCH"])
def test_a_listed_route_with_another_method_is_405(method: str) -> None:
    """`chat/completions` takes POST only and `models` GET only, and they say so (`allow`)."""
    refused = model_call(method, b"/episodes/ep-1/v1/chat/completions")
    assert refused == Refused(405, "this route takes POST", ("POST",))
    if method != "GET":
        assert model_call(method, b"/v1/models") == Refused(405, "this route takes GET", ("GET",))


def test_names_in_the_url_may_be_escaped_but_never_into_separators() -> None:
    """An agent name may carry escaped characters (decoded for the label); an escape of a
    separator or a dot is refused anywhere."""
    raw = b"/episodes/ep-1/agents/r%C3%A9viseur%20A/v1/chat/completions"
    assert check_raw_path(raw) is None
    assert model_call("POST", raw) == ModelCall("/v1/chat/completions", "ep-1", "réviseur A")
    assert isinstance(check_raw_path(b"/episodes/ep-1/agents/a%2Fb/v1/models"), Refused)
    refused = model_call("POST", b"/v1/chat/completion%73")  # an escape inside a route: not listed
    assert isinstance(refused, Refused) and refused.status == 404


def test_paths_that_are_not_agent_urls_are_left_to_the_control_api() -> None:
    for raw in (b"/control/episodes", b"/healthz", b"/", b"/sleep", b"/episodes/ep-1/close"):
        assert check_raw_path(raw) is None and model_call("GET", raw) is None


def test_queries_are_visible_ascii_without_a_fragment() -> None:
    assert check_query(b"") is None and check_query(b"api-version=2024-10-21&x=/../y") is None
    for query in (b"a=b#/../sleep", b"a=\x00", b"a=\xff", b"a= b"):
        refused = check_query(query)
        assert isinstance(refused, Refused) and refused.status == 400

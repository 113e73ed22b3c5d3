"""The gateway forwards model calls and nothing else, over real HTTP: path tricks sent byte for
byte (no client library normalizes them) on every URL form and both methods never reach the
upstream, which records every path it receives."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

import tito_agents as tito
from tests.support.gateway_harness import RecordingUpstream, ServedGateway, raw_request, vllm_error
from tito_agents.gateway._routes import MODEL_ROUTES
from tito_agents.sinks import MemorySink
from tito_agents.testing.fake_vllm import MODEL_NAME

CHAT = orjson.dumps(
    {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Say something."}],
        "max_tokens": 8,
    }
)
# (path prefix, headers): the four ways a call names its episode
FORMS = {
    "episode path": ("/episodes/ep-1/v1", {}),
    "agent path": ("/episodes/ep-1/agents/solver/v1", {}),
    "header": ("/v1", {"X-Tito-Episode": "ep-1"}),
    "no episode": ("/v1", {}),
}
TRICKS = [
    "/../../sleep",
    "/../sleep",
    "/../../../../collective_rpc",
    "/..%2F..%2Fsleep",
    "/..%2f..%2fwake_up",
    "/%2e%2e/%2e%2e/metrics",
    "/%2E%2E/%2E%2E/pause",
    "/%2E./update_weights",
    "/.%2e/reset_prefix_cache",
    "/./chat/completions",
    "/chat/completions/../../../sleep",
    "/chat%2Fcompletions",
    "/..%5Csleep",
    "/..\\sleep",
    "//chat/completions",
    "/chat/completions%00",
    "/%252e%252e/%252e%252e/sleep",
    "/%c0%ae%c0%ae/sleep",
]
OFF_THE_LIST = ["/load_lora_adapter", "/embeddings", "/chat/completions/render", "/sleep", ""]
ALLOWED = {f"/v1/{route}".replace("{id}", MODEL_NAME).encode() for route in MODEL_ROUTES}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RecordingUpstream]:
    with RecordingUpstream() as server:
        yield server


@pytest.fixture
def served(upstream: RecordingUpstream) -> Iterator[ServedGateway]:
    collector = tito.Collector(MemorySink())
    with ServedGateway(collector, upstream.base_url, read_timeout=30.0) as gateway:
        gateway.control().open("ep-1")
        upstream.requests.clear()
        yield gateway
    collector.close()
    assert set(upstream.paths()) <= ALLOWED, "a path off the allow-list reached the upstream"


@pytest.mark.parametrize("form", FORMS)
def test_path_tricks_are_refused_and_never_reach_the_upstream(
    served: ServedGateway, upstream: RecordingUpstream, form: str
) -> None:
    """Dot segments (plain, encoded, mixed case, half encoded), encoded separators, backslashes,
    double slashes, NUL, double encoding, overlong UTF-8: 400 in vLLM's error shape, for GET and
    POST, and the upstream receives nothing."""
    prefix, headers = FORMS[form]
    for trick in TRICKS:
        for method in ("GET", "POST"):
            line = f"{method} {prefix}{trick} HTTP/1.1".encode()
            status, fields, body = raw_request(served.port, line, headers, CHAT)
            assert status == 400, (line, body)
            assert fields["content-type"] == "application/json"
            vllm_error(body, 400)
    assert upstream.requests == []


@pytest.mark.parametrize("form", FORMS)
def test_routes_off_the_list_are_404_and_other_methods_405(
    served: ServedGateway, upstream: RecordingUpstream, form: str
) -> None:
    """LoRA loading under /v1, other endpoints and the bare /v1: 404; a listed route with a
    method it does not take (HEAD, OPTIONS, PUT, DELETE, GET on a POST route): 405 with Allow."""
    prefix, headers = FORMS[form]
    for route in OFF_THE_LIST:
        for method in ("GET", "POST"):
            line = f"{method} {prefix}{route} HTTP/1.1".encode()
            status, _, body = raw_request(served.port, line, headers, CHAT)
            assert status == 404, (line, body)
            vllm_error(body, 404)
    for method in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE"):
        line = f"{method} {prefix}/chat/completions HTTP/1.1".encode()
        status, fields, body = raw_request(served.port, line, headers)
        assert (status, fields["allow"]) == (405, "POST"), line
        if method != "HEAD":
            vllm_error(body, 405)
    assert upstream.requests == []


@pytest.mark.parametrize("form", FORMS)
def test_the_allow_list_is_forwarded_as_received(
    served: ServedGateway, upstream: RecordingUpstream, form: str
) -> None:
    """Each listed route reaches the upstream as `/v1/<route>`, its query string kept."""
    prefix, headers = FORMS[form]
    status, _, body = raw_request(
        served.port, f"POST {prefix}/chat/completions HTTP/1.1".encode(), headers, CHAT
    )
    assert status == 200 and orjson.loads(body)["choices"], body
    status, _, body = raw_request(
        served.port, f"GET {prefix}/models?x=1 HTTP/1.1".encode(), headers
    )
    assert status == 200 and orjson.loads(body)["data"][0]["id"] == MODEL_NAME
    assert upstream.requests == [
        ("POST", b"/v1/chat/completions"),
        ("GET", b"/v1/models?x=1"),
    ]


def test_absolute_form_and_odd_targets_never_reach_the_upstream(
    served: ServedGateway, upstream: RecordingUpstream
) -> None:
    """`POST http://host/v1/../sleep HTTP/1.1`, an asterisk target, a query with a fragment and
    a path longer than any route: refused (400 or 414), nothing forwarded."""
    host = f"http://127.0.0.1:{upstream.port}"
    for line, status in [
        (f"POST {host}/v1/../sleep HTTP/1.1", 400),
        (f"POST {host}/sleep HTTP/1.1", 400),
        (f"GET {host}/episodes/ep-1/v1/%2e%2e/%2e%2e/metrics HTTP/1.1", 400),
        ("OPTIONS * HTTP/1.1", 400),
        ("POST /v1/chat/completions?a=#/../../sleep HTTP/1.1", 400),
        ("POST /v1/" + "a/" * 1100 + "sleep HTTP/1.1", 414),
    ]:
        got, _, body = raw_request(served.port, line.encode(), {}, CHAT)
        assert got == status, (line, body)
        vllm_error(body, status)
    assert upstream.requests == []


def test_the_control_api_answers_errors_in_the_same_shape(served: ServedGateway) -> None:
    """A control route with the wrong method (405) or an unknown path (404): JSON, never text."""
    control = served.control()
    response = control.http.delete("/control/episodes")
    assert response.status_code == 405 and response.headers["allow"]
    vllm_error(response.content, 405)
    response = control.http.get("/control/nothing-here")
    assert response.status_code == 404
    vllm_error(response.content, 404)

"""The wire parser on its own: fast body path vs whole parse, SSE framing at any byte boundary."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.capture_replay import load_capture
from tito_agents._capture import wire as _wire
from tito_agents._capture.wire import ResponseParser, SSEDecoder, fastpath, prepare_request
from tito_agents.calls import Endpoint
from tito_agents.errors import MalformedResponseError

ids_st = st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=700)
ID_PARSERS = ["c", "numpy"]


@contextlib.contextmanager
def id_parser(kind: str) -> Iterator[None]:
    """Parse cut-out id arrays with the C helper, or with the numpy path used without it."""
    saved = fastpath._speedups
    if kind == "numpy":
        fastpath._speedups = None  # type: ignore[assignment]
    try:
        yield
    finally:
        fastpath._speedups = saved


def chat_body(prompt: list[int], choices: list[list[int]], logprobs: bool) -> bytes:
    """A vLLM 0.32-shaped non-streaming chat body (key order as the server emits it)."""
    out = []
    for i, ids in enumerate(choices):
        content = (
            {
                "content": [
                    {
                        "token": f't"{t}]}}',
                        "logprob": -0.25 * (t % 7),
                        "bytes": [116],
                        "top_logprobs": [],
                    }
                    for t in ids
                ]
            }
            if logprobs
            else None
        )
        out.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": 'x]},"finish_reason":'},
                "logprobs": content,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": ids,
                "routed_experts": None,
            }
        )
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": out,
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": sum(map(len, choices)),
            "total_tokens": len(prompt) + sum(map(len, choices)),
        },
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def info(logprobs: bool) -> Any:
    payload = b'{"model":"m","messages":[]' + (b',"logprobs":true}' if logprobs else b"}")
    prepared = prepare_request(Endpoint.CHAT, payload, capture_logprobs=False)
    assert prepared is not None
    return prepared[1]


@settings(max_examples=60, deadline=None)
@given(prompt=ids_st, choices=st.lists(ids_st, min_size=1, max_size=3), logprobs=st.booleans())
def test_fast_body_path_equals_the_plain_json_reading(
    prompt: list[int], choices: list[list[int]], logprobs: bool
) -> None:
    """Cutting long arrays out of the body gives exactly what a full JSON parse gives."""
    body = chat_body(prompt, choices, logprobs)
    for kind in ID_PARSERS:
        with id_parser(kind):
            check_parsed(ResponseParser(info(logprobs)).parse_body(body), prompt, choices, logprobs)


def check_parsed(parsed: Any, prompt: list[int], choices: list[list[int]], logprobs: bool) -> None:
    assert len(parsed) == len(choices)
    for choice, ids in zip(parsed, choices, strict=True):
        assert choice.error is None
        assert choice.prompt_ids is not None and choice.prompt_ids.tolist() == prompt
        assert choice.sampled_ids is not None and choice.sampled_ids.tolist() == ids
        assert choice.sampled_ids.dtype == np.int32
        if logprobs:
            assert choice.logprobs is not None
            assert choice.logprobs.tolist() == pytest.approx([-0.25 * (t % 7) for t in ids])


def without_added_ids(body: bytes) -> Any:
    """What the caller of a request without `return_token_ids` gets from vLLM: the ids null."""
    data = json.loads(body)
    data["prompt_token_ids"] = None
    for choice in data["choices"]:
        choice["token_ids"] = None
    return data


@settings(max_examples=60, deadline=None)
@given(prompt=ids_st, choices=st.lists(ids_st, min_size=1, max_size=3), logprobs=st.booleans())
def test_caller_body_is_the_servers_own_bytes_with_the_added_ids_null(
    prompt: list[int], choices: list[list[int]], logprobs: bool
) -> None:
    """Long bodies are rebuilt from the server's bytes (not serialized again): byte for byte what
    the server sends a request without `return_token_ids`; logprobs the caller asked are kept."""
    body = chat_body(prompt, choices, logprobs)
    parser = ResponseParser(info(logprobs))
    parser.parse_body(body)
    got = parser.caller_body()
    assert got is not None
    want = without_added_ids(body)
    if len(body) >= 2048:  # the cut-out path
        assert got == json.dumps(want, separators=(",", ":")).encode()
    else:
        assert json.loads(got) == want


def test_arrays_capture_did_not_add_are_handed_on_as_they_came() -> None:
    """Only the ids capture asked for are nulled; another array of ids (here in
    `kv_transfer_params`, as with disaggregated prefill) reaches the caller unchanged."""
    data = json.loads(chat_body(list(range(700)), [[5, 6, 7]], False))
    data["kv_transfer_params"] = {"prompt_token_ids": [9, 8, 7]}
    body = json.dumps(data, separators=(",", ":")).encode()
    parser = ResponseParser(info(False))
    (choice,) = parser.parse_body(body)
    assert choice.prompt_ids is not None and choice.prompt_ids.tolist() == list(range(700))
    got = parser.caller_body()
    assert got is not None
    assert got == json.dumps(without_added_ids(body), separators=(",", ":")).encode()
    assert json.loads(got)["kv_transfer_params"] == {"prompt_token_ids": [9, 8, 7]}


@pytest.mark.parametrize(
    "bad",
    [
        b"1,2.5,3",
        b"1,-2,3",
        b'1,"2",3',
        b"1,,3",
        b"1,2,99999999999",
        b"1, ,3",
        b"1,2,",
        b"+1,2",
        b"1,true,3",
        b"1,01,3",
        b"01,2",
    ],
)
@pytest.mark.parametrize("kind", ID_PARSERS)
def test_fast_path_falls_back_and_names_bad_ids(bad: bytes, kind: str) -> None:
    """Ids that are not plain non-negative int32 take the full parse, which raises a typed error."""
    body = chat_body(list(range(600)), [[5, 6, 7]], False).replace(b"[5,6,7]", b"[" + bad + b"]")
    parsed = None
    try:
        with id_parser(kind):
            parsed = ResponseParser(info(False)).parse_body(body)
    except MalformedResponseError:
        return  # not JSON at all ("1,,3")
    assert isinstance(parsed[0].error, MalformedResponseError)


@pytest.mark.parametrize("spaced", [b"5, 6, 7", b" 5,6 ,7 ", b"5,\n6,\t7"])
@pytest.mark.parametrize("kind", ID_PARSERS)
def test_ids_in_spaced_json_are_read_exactly(spaced: bytes, kind: str) -> None:
    """Valid JSON that is not compact gives the exact ids either way (numpy's text parser alone
    would read "1, ,2" as [1, 0, 2], so without the C helper it leaves the fast path)."""
    body = chat_body(list(range(600)), [[5, 6, 7]], False).replace(b"[5,6,7]", b"[" + spaced + b"]")
    with id_parser(kind):
        (parsed,) = ResponseParser(info(False)).parse_body(body)
    assert parsed.error is None and parsed.sampled_ids is not None
    assert parsed.sampled_ids.tolist() == [5, 6, 7]


def test_tool_call_capture_parses_identically_both_ways() -> None:
    """A real tool-call body gives the same ids through either path."""
    cap = load_capture("multi_turn_tool")
    fast = ResponseParser(info(False)).parse_body(cap.body)
    body = cap.json()
    assert fast[0].prompt_ids is not None and fast[0].sampled_ids is not None
    assert fast[0].prompt_ids.tolist() == body["prompt_token_ids"]
    assert fast[0].sampled_ids.tolist() == body["choices"][0]["token_ids"]


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, 40), min_size=1, max_size=30), crlf=st.booleans())
def test_sse_decoder_is_independent_of_chunk_boundaries(cuts: list[int], crlf: bool) -> None:
    """However the bytes are split, the decoder yields the same events."""
    cap = load_capture("chat_stream_n2")
    data = cap.body.replace(b"\n", b"\r\n") if crlf else cap.body
    want = [e.strip()[6:] for e in cap.body.split(b"\n\n") if e.strip()]
    decoder, got, pos = SSEDecoder(), [], 0
    for cut in cuts * (len(data) // max(1, sum(cuts)) + 1):
        if pos >= len(data):
            break
        got += decoder.feed(data[pos : pos + cut])
        pos += cut
    got += decoder.feed(data[pos:]) + decoder.flush()
    assert got == want
    assert orjson.loads(got[0])["choices"][0]["index"] == 0


# ---- ids are JSON integers, never booleans ---------------------------------------------------

BOOLEAN_IDS = [[True, False], [448, True, 2], [0, False]]


def completions_body(prompt: list[Any], ids: list[Any]) -> bytes:
    """A vLLM 0.32-shaped non-streaming completions body."""
    choice = {
        "index": 0,
        "text": "x",
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": ids,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
    }
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids)}
    body = {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [choice]}
    return orjson.dumps({**body, "usage": usage})


def body_with_ids(endpoint: Endpoint, field: str, bad: list[Any], long: bool) -> bytes:
    """A body whose `field` holds `bad`; `long`: over 2 KB, so the cut-out path reads it."""
    filler = list(range(100, 800)) if long else [100, 101]
    prompt, ids = (bad, filler) if field == "prompt_token_ids" else (filler, bad)
    if endpoint is Endpoint.CHAT:
        data = json.loads(chat_body([0], [[0]], False))
        data["prompt_token_ids"], data["choices"][0]["token_ids"] = prompt, ids
        data["usage"]["completion_tokens"] = len(ids)
        return orjson.dumps(data)
    return completions_body(prompt, ids)


def request_info(endpoint: Endpoint, *, stream: bool = False, logprobs: bool = False) -> Any:
    payload: dict[str, Any] = {"model": "m", "stream": stream}
    if endpoint is Endpoint.CHAT:
        payload["messages"] = []
    else:
        payload["prompt"] = "p"
    prepared = prepare_request(endpoint, orjson.dumps(payload), capture_logprobs=logprobs)
    assert prepared is not None
    return prepared[1]


@pytest.mark.parametrize("bad", BOOLEAN_IDS, ids=["bools", "mixed", "zero-false"])
@pytest.mark.parametrize("field", ["token_ids", "prompt_token_ids"])
@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS], ids=["chat", "cmpl"])
@pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
@pytest.mark.parametrize("kind", [*ID_PARSERS, "python"])
def test_booleans_are_never_ids_in_a_body(
    bad: list[Any], field: str, endpoint: Endpoint, long: bool, kind: str
) -> None:
    """`true`/`false` among ids is a typed error whatever reads the body: the whole-body parse,
    the cut-out arrays read by the C helper or by numpy, or `to_ids` itself ("python")."""
    if kind == "python":
        for parser in ID_PARSERS:
            with id_parser(parser), pytest.raises(MalformedResponseError):
                _wire.to_ids(bad, field)
        return
    body = body_with_ids(endpoint, field, bad, long)
    assert (len(body) >= 2048) is long
    with id_parser(kind):
        try:
            parsed = ResponseParser(request_info(endpoint)).parse_body(body)
        except MalformedResponseError:
            return  # chat prompt ids are read before the choices: the body fails as a whole
    assert [type(c.error) for c in parsed] == [MalformedResponseError]


def stream_events(endpoint: Endpoint, prompt: list[Any], ids: list[Any]) -> list[dict[str, Any]]:
    """The events of a one-choice stream: its prompt ids where vLLM puts them, then `ids`."""
    if endpoint is Endpoint.CHAT:
        first = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
        first["prompt_token_ids"] = prompt
        chunk = {"index": 0, "delta": {"content": "x"}, "finish_reason": "stop", "token_ids": ids}
        return [first, {"id": "c", "choices": [chunk]}]
    choice = {"index": 0, "text": "x", "finish_reason": "length", "prompt_token_ids": prompt}
    return [{"id": "c", "choices": [{**choice, "token_ids": ids}]}]


@pytest.mark.parametrize("bad", BOOLEAN_IDS, ids=["bools", "mixed", "zero-false"])
@pytest.mark.parametrize("field", ["token_ids", "prompt_token_ids"])
@pytest.mark.parametrize("endpoint", [Endpoint.CHAT, Endpoint.COMPLETIONS], ids=["chat", "cmpl"])
def test_booleans_are_never_ids_in_a_stream(bad: list[Any], field: str, endpoint: Endpoint) -> None:
    """Streamed delta ids and streamed prompt ids: the same typed error, no sampled ids."""
    good = [448, 316]
    prompt, ids = (bad, good) if field == "prompt_token_ids" else (good, bad)
    parser = ResponseParser(request_info(endpoint, stream=True))
    for event in stream_events(endpoint, prompt, ids):
        parser.feed_event(orjson.loads(orjson.dumps(event)))
    (choice,) = parser.finish_stream()
    assert isinstance(choice.error, MalformedResponseError)
    assert choice.sampled_ids is None


def test_ids_one_and_zero_are_still_ids() -> None:
    """The boolean check compares by type: the ids 1 and 0 themselves are kept."""
    parser = ResponseParser(request_info(Endpoint.CHAT, stream=True))
    for event in stream_events(Endpoint.CHAT, [1, 0], [0, 1, 2]):
        parser.feed_event(event)
    (choice,) = parser.finish_stream()
    assert choice.error is None and choice.sampled_ids is not None
    assert choice.sampled_ids.tolist() == [0, 1, 2]
    assert _wire.to_ids([1, 0], "ids").tolist() == [1, 0]


# ---- the cut-out markers cannot collide with what a server sends -----------------------------

MARKER_TEXTS = ["\x00tito:0", "\x00tito:1", "\x00tito:2"]


def place_marker(data: dict[str, Any], place: str, text: str) -> None:
    choice = data["choices"][0]
    if place == "content":
        choice["message"]["content"] = text
    elif place == "tool-arguments":
        function = {"name": "get_weather", "arguments": text}
        choice["message"]["tool_calls"] = [{"id": "c1", "type": "function", "function": function}]
    elif place == "kv_transfer_params":
        data["kv_transfer_params"] = {"prompt_token_ids": text, "note": text}
    elif place == "key":
        data["metrics"] = {text: [7, 8], "x": {text: text}}
    else:  # the sampled ids themselves, with usage fitting what the marker would stand for
        choice["token_ids"] = text
        data["usage"]["completion_tokens"] = len(data["prompt_token_ids"])


@pytest.mark.parametrize("text", MARKER_TEXTS, ids=["m0", "m1", "m2"])
@pytest.mark.parametrize(
    "place", ["content", "tool-arguments", "kv_transfer_params", "key", "token_ids"]
)
@pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
@pytest.mark.parametrize("capture_logprobs", [False, True], ids=["ids", "ids+logprobs"])
@pytest.mark.parametrize("kind", ID_PARSERS)
def test_marker_shaped_strings_from_the_server_are_only_strings(
    text: str, place: str, long: bool, capture_logprobs: bool, kind: str
) -> None:
    """A server string equal to capture's internal marker, anywhere (a value, a key, where the ids
    belong): the caller's body is the server's, byte for byte, but for the fields capture added;
    the recorded ids are the real ones, or a typed error where the ids are that string."""
    prompt, ids = (list(range(600)) if long else [1, 2, 3]), [5, 6, 7]
    data = json.loads(chat_body(prompt, [ids], capture_logprobs))
    place_marker(data, place, text)
    body = orjson.dumps(data)
    assert (len(body) >= 2048) is long
    parser = ResponseParser(request_info(Endpoint.CHAT, logprobs=capture_logprobs))
    with id_parser(kind):
        (choice,) = parser.parse_body(body)
        caller = parser.caller_body()
    want = json.loads(body)
    want["prompt_token_ids"] = want["choices"][0]["token_ids"] = None
    if capture_logprobs:
        want["choices"][0]["logprobs"] = None
    assert caller == orjson.dumps(want)
    if place == "token_ids":
        assert isinstance(choice.error, MalformedResponseError)
        assert choice.sampled_ids is None
        return
    assert choice.error is None
    assert choice.prompt_ids is not None and choice.prompt_ids.tolist() == prompt
    assert choice.sampled_ids is not None and choice.sampled_ids.tolist() == ids


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=15,
)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if path:
        yield path
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for step, child in items:
        yield from _paths(child, (*path, step))


def _set_null(value: Any, path: tuple[Any, ...]) -> None:
    for step in path[:-1]:
        value = value[step]
        if value is None:  # a value on the way was nulled whole
            return
    value[path[-1]] = None


@settings(max_examples=200, deadline=None)
@given(value=_JSON, indent=st.sampled_from([None, 1, 4]), data=st.data())
def test_null_values_nulls_exactly_the_paths_it_is_given(
    value: Any, indent: int | None, data: Any
) -> None:
    """`splice.null_values` on any document, however spaced: the values at the paths given are
    null, nothing else changed, and a path the body lacks changes nothing."""
    from tito_agents._capture.wire.splice import null_values

    body = json.dumps(value, indent=indent, ensure_ascii=data.draw(st.booleans())).encode()
    paths = sorted(_paths(value), key=len)
    chosen = data.draw(st.lists(st.sampled_from(paths), max_size=3)) if paths else []
    want = json.loads(body)
    for path in chosen:
        _set_null(want, path)
    got = null_values(body, [*chosen, ("no such key", 7)])
    assert json.loads(got) == want
    assert null_values(body, [("no such key",), (99, "x")]) == body


def test_null_values_reaches_through_containers_of_any_depth() -> None:
    """Containers deeper than the one-match pattern reaches are passed bracket by bracket; keys
    written with escapes are found as the text they stand for."""
    from tito_agents._capture.wire.splice import null_values

    deep = "[" * 20 + '{"k": "]}"}' + "]" * 20
    body = f'{{"a": {deep}, "b\\u0020c" : {{"x": {deep}, "y": 1}}, "z": {deep}}}'.encode()
    got = null_values(body, [("b c", "y"), ("z",), ("a", 0, 0)])
    want = json.loads(body)
    want["b c"]["y"], want["z"], want["a"][0][0] = None, None, None
    assert json.loads(got) == want
    assert got.startswith(b'{"a": [[null]') and b'"b\\u0020c" : {"x": [[' in got

"""The fast path for long id arrays: they are cut out of the body bytes and parsed by the C helper
(`tito_agents/_speedups.c`) or numpy, so the JSON parser never builds a Python int per token. The
logprobs are cut out too (chat: the entries; completions: the whole logprobs object): the C helper
reads their numbers from the bytes, so no entry, token or offset object is built (without it, or
when it is unsure, they are parsed whole)."""

from __future__ import annotations

import re
import warnings
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from tito_agents._capture.wire.splice import Path
from tito_agents.calls import IdArray, LogprobArray
from tito_agents.errors import (
    MalformedResponseError,
)

_MAX_ID = 2**31 - 1
"""The largest id vLLM can send (int32)."""


class _FallBack(Exception):
    """A cut-out segment did not parse on the fast path: parse the body whole instead."""


_ID_KEY = b'token_ids":['
_TOKENS_KEY = b'"tokens":['
"""Where a Responses body's ids are (its `input_messages` / `output_messages` entries)."""
_CONTENT_KEY = b'"logprobs":{"content":['
_COMPLETION_KEY = b'"logprobs":{"text_offset":'
"""How vLLM begins a completions choice's logprobs object (its other arrays follow)."""
_OBJECT_OPEN = len(b'"logprobs":{')
_PART_KEY = b'"logprobs":['
"""How vLLM writes the entries of a Responses output text part (the chat entry shape)."""
_CONTENT_END = b']},"finish_reason":'
_WRAP_OPEN = b'{"content":'
"""What stands before the entries of a chat logprobs object cut out of a body."""
_MARK = "\x00tito:"
_NUL = b"\\u0000"
"""How NUL, which starts every marker, appears in JSON text (a raw NUL byte is invalid JSON)."""


def _marker(i: int) -> bytes:
    """The JSON string standing in for cut-out array `i` (it decodes to `_MARK` + i)."""
    return b'"\\u0000tito:%d"' % i


_DIGITS = b"0123456789,"
_DIGIT_BYTES = frozenset(b"0123456789")
_LEADING_ZERO = re.compile(rb",0[0-9]")


def _fromstring_raises() -> bool:
    """Whether this numpy raises on text it cannot read to the end (newer numpy) rather than
    warning (older numpy, where the warning must be turned into an error around each parse)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            np.fromstring(b"1,,2", dtype=np.int64, sep=",")
        except ValueError:
            return True
    return False


_FROMSTRING_RAISES = _fromstring_raises()

try:  # the optional C helper (tito_agents/_speedups.c, built at install when a compiler exists)
    from tito_agents import _speedups
except ImportError:  # pragma: no cover - depends on the install
    _speedups = None  # type: ignore[assignment]


def _id_array(text: bytes | memoryview) -> IdArray | None:
    """The ids of the text between the brackets of a JSON id list, or None when it is not only
    JSON integers in [0, 2**31) (a float, a string, `true`, a sign...).

    With the C helper: one pass (JSON whitespace allowed). Without it, numpy's text parser on
    compact JSON only (what vLLM sends: digits and single commas), since numpy reads "1, ,2" as
    [1, 0, 2]."""
    if _speedups is not None:  # one pass in C: validation and values
        parsed = _speedups.parse_ids(text)
        return None if parsed is None else np.frombuffer(parsed, dtype=np.int32)
    text = bytes(text)
    if not text:
        return np.zeros(0, dtype=np.int32)
    if text.translate(None, _DIGITS) or text[0] not in _DIGIT_BYTES or text[-1] not in _DIGIT_BYTES:
        return None
    if (text[0] == 48 and text[1:2].isdigit()) or (b",0" in text and _LEADING_ZERO.search(text)):
        return None  # "01" is not JSON (numpy reads it as 1; the C helper refuses it too)
    try:  # an empty item (",,") is text numpy cannot read to the end: ValueError
        values = _parse_int_text(text)
    except ValueError:
        return None
    if values.max() > _MAX_ID:  # numpy saturates at 2**63 - 1, so this sees every overflow
        return None
    return values.astype(np.int32)


def _chat_logprob_array(body: bytes, start: int) -> tuple[int, LogprobArray] | None:
    """Where the chat `logprobs.content` array (or a Responses output part's `logprobs`: the same
    entries) whose entries begin at `start` in `body` closes, and the float32 `logprob` of each
    entry; None when only the full parse can say.

    The C helper validates the entries as JSON while it reads them, each number correctly
    rounded, so an answer is bit for bit what the full parse gives (`float32(entry["logprob"])`),
    and the bracket it stops at is the array's own; it declines whatever it cannot be sure of (a
    missing or integer `logprob`, a key spelled with escapes, invalid JSON...). Without the helper
    there is no faster exact reading: always None."""
    if _speedups is None:
        return None
    read = _speedups.chat_logprobs(body, start)
    if read is None:
        return None
    return read[0], np.frombuffer(read[1], dtype=np.float32)


def _completion_logprob_object(body: bytes, start: int) -> tuple[int, LogprobArray] | None:
    """Where the completions `logprobs` object whose members begin at `start` in `body` closes,
    and its `token_logprobs` as float32; None when only the full parse can say (or there is no C
    helper). As `_chat_logprob_array`: validated as JSON while read, bit for bit
    `np.array(token_logprobs, dtype=np.float32)`; a null among them (an echoed first token), an
    integer or a missing list are declined."""
    if _speedups is None:
        return None
    read = _speedups.completion_logprobs(body, start)
    if read is None:
        return None
    return read[0], np.frombuffer(read[1], dtype=np.float32)


def _parse_int_text(segment: bytes) -> npt.NDArray[np.int64]:
    """`np.fromstring` of comma-separated ints; raises ValueError on text it cannot read whole."""
    if _FROMSTRING_RAISES:
        return np.fromstring(segment, dtype=np.int64, sep=",")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return np.fromstring(segment, dtype=np.int64, sep=",")
        except DeprecationWarning as exc:
            raise ValueError(str(exc)) from None


class _BodySegments:
    """A JSON body with its long arrays cut out and replaced by marker strings.

    `token_ids` arrays become int32 arrays through `_id_array`, so the JSON parser builds no
    Python int per token; logprobs are read by the C helper as they are cut out (`split`). The
    cuts start where a byte search finds their keys (the keys contain quotes, which cannot occur
    unescaped inside a string) and end at the closing bracket found by search (ids) or by the C
    scan that reads the logprobs. The cut-out values are views of the body, not copies.

    A marker is a JSON string starting with NUL. The server's text can only hold NUL as the escape
    `\\u0000`; a body with one anywhere outside the cut-out arrays is not split (it parses whole),
    so no string a server sends, as a value or a key, can be taken for a marker, and no marker text
    can be found in the server's own strings when `restore` puts the arrays back.
    """

    __slots__ = ("_objects", "_pieces", "_raw", "_values", "skeleton")

    def __init__(
        self,
        pieces: list[bytes],
        raw: list[memoryview],
        values: dict[int, LogprobArray],
        objects: set[int],
    ) -> None:
        self._pieces = pieces
        """The body between the cut-out arrays (one more piece than arrays)."""
        self._raw = raw
        self._values = values
        """The logprobs of the cut-out logprobs the C helper read while cutting."""
        self._objects = objects
        """The cut-out values that are objects (a completions logprobs object), not arrays."""
        parts = [pieces[0]]
        for i in range(len(raw)):
            parts += (_marker(i), pieces[i + 1])
        self.skeleton = b"".join(parts)

    @classmethod
    def split(
        cls,
        body: bytes,
        layout: Literal["chat", "completions", "responses"],
        *,
        logprobs: bool,
        min_size: int = 2048,
    ) -> _BodySegments | None:
        """Cut the id arrays, and the logprobs when `logprobs`, out of `body`, a body of
        `layout` (None when the body is shorter than `min_size`: small bodies parse whole just as
        fast).

        Logprobs are cut only when asked for: looking for them in a body that has none would
        search all of it. Chat entries are cut whenever found: where the C helper reads them it
        also finds where they end, so their bytes are read once; otherwise the end is searched
        for (`_CONTENT_END`, what vLLM writes after them) and they are parsed whole later. A
        completions logprobs object, or a Responses output part's entries, are cut only where the
        C helper reads them (their end can be found no other way); otherwise they stay in the
        skeleton. A Responses body's ids are its engine messages' `tokens`."""
        if len(body) < min_size:
            return None
        view = memoryview(body)
        pieces: list[bytes] = []
        raw: list[memoryview] = []
        values: dict[int, LogprobArray] = {}
        objects: set[int] = set()
        pos = 0
        chat, completions = layout == "chat", layout == "completions"
        lp_key = _CONTENT_KEY if chat else _COMPLETION_KEY if completions else _PART_KEY
        id_key = _TOKENS_KEY if layout == "responses" else _ID_KEY
        if not chat and _speedups is None:
            logprobs = False  # only the C helper finds where these end
        found = body.find(lp_key) if logprobs else -1
        while True:
            # the next cut: the id key before the next logprobs, else those logprobs
            bound = len(body) if found == -1 else found
            key = body.find(id_key, pos, bound)
            if key != -1:
                start = key + len(id_key)
                end = body.find(b"]", start)
                if end == -1 or (found != -1 and end > found):
                    return None
            elif found != -1 and chat:
                start = found + len(_CONTENT_KEY)
                read = _chat_logprob_array(body, start)
                if read is not None:
                    end, values[len(raw)] = read
                else:
                    end = body.find(_CONTENT_END, start)
                    if end == -1:
                        return None
                found = body.find(_CONTENT_KEY, end)
            elif found != -1:
                if completions:
                    start = found + _OBJECT_OPEN
                    read = _completion_logprob_object(body, start)
                else:
                    start = found + len(_PART_KEY)
                    read = _chat_logprob_array(body, start)
                found = body.find(lp_key, start)
                if read is None:
                    continue  # left in the skeleton: parsed whole
                end, values[len(raw)] = read
                if completions:
                    objects.add(len(raw))
            else:
                break
            pieces.append(body[pos : start - 1])
            raw.append(view[start:end])
            pos = end + 1
        if not raw:
            return None
        pieces.append(body[pos:])
        if any(_NUL in piece for piece in pieces):
            # a string of the server's may hold NUL (JSON writes it only as \u0000), so it could
            # equal a marker: no markers then. Otherwise every string the skeleton parses to that
            # starts with `_MARK` is a marker this split put exactly where its array was cut out.
            return None
        return cls(pieces, raw, values, objects)

    def nulled_at(self, payload: Any, paths: list[Path]) -> set[int] | None:
        """The cut-out arrays that are the whole value at each of `paths` in `payload` (the parsed
        skeleton; a chat `logprobs` object, `{"content": [...]}`, counts as its entries' array),
        for `join`; None when a value there is anything else (not null), which then takes the
        general path (`restore`)."""
        nulled: set[int] = set()
        for path in paths:
            value = payload
            for step in path:
                value = value[step]
            if value is None:
                continue
            wrapped = type(value) is dict and len(value) == 1 and "content" in value
            index = self.index_of(value["content"] if wrapped else value)
            if index is None or self._wrapped(index) is not wrapped:
                return None
            nulled.add(index)
        return nulled

    def _wrapped(self, i: int) -> bool:
        """Whether cut-out array `i` is the entries of a chat `logprobs` object: the whole object
        stands around it in the body, `{"content":` before and `}` after."""
        return self._pieces[i].endswith(_WRAP_OPEN) and self._pieces[i + 1][:1] == b"}"

    def join(self, nulled: set[int]) -> bytes:
        """The body again, byte for byte, except that the cut-out arrays `nulled` are `null` (the
        whole logprobs object around one that is a chat logprobs' entries)."""
        pieces, raw = self._pieces, self._raw
        parts: list[bytes | memoryview] = []
        piece = pieces[0]
        for i, segment in enumerate(raw):
            after = pieces[i + 1]
            if i not in nulled:
                parts += (piece, *self._brackets(i, segment))
            elif self._wrapped(i):
                parts += (piece[: -len(_WRAP_OPEN)], b"null")
                after = after[1:]
            else:
                parts += (piece, b"null")
            piece = after
        parts.append(piece)
        return b"".join(parts)

    def restore(self, edited: bytes) -> bytes:
        """`edited` (the skeleton with some values spliced to null) with every marker still in it
        replaced by the array it stands for: the server's body, but for what was nulled."""
        for i, raw in enumerate(self._raw):
            marker = _marker(i)
            if marker in edited:
                edited = edited.replace(marker, b"".join(self._brackets(i, raw)))
        return edited

    def _brackets(self, i: int, segment: memoryview) -> tuple[bytes, memoryview, bytes]:
        """Cut-out value `i` with the brackets it was cut out of around it."""
        return (b"{", segment, b"}") if i in self._objects else (b"[", segment, b"]")

    def index_of(self, value: Any) -> int | None:
        """Which cut-out array a parsed skeleton value stands for, or None if it is no marker."""
        if type(value) is not str or not value.startswith(_MARK):
            return None
        digits = value[len(_MARK) :]
        if not digits.isdigit() or int(digits) >= len(self._raw):
            return None
        return int(digits)

    def _segment(self, marker: str) -> memoryview:
        index = self.index_of(marker)
        if index is None:
            raise MalformedResponseError("token ids are a string, expected a list of ints")
        return self._raw[index]

    def ids(self, marker: str) -> IdArray:
        """The ids of a cut-out array; `_FallBack` when the text is not plain JSON integers in
        [0, 2**31), so the full parser accepts valid JSON and names the problem in the rest."""
        ids = _id_array(self._segment(marker))
        if ids is None:
            raise _FallBack
        return ids

    def logprobs(self, marker: str) -> LogprobArray | None:
        """The logprobs of cut-out logprobs (a chat `logprobs.content` array, a completions
        `logprobs` object), read from their bytes while they were cut out; None when the C helper
        could not be sure (or is missing): then chat's `logprob_entries` parses them (completions
        logprobs are then not cut out)."""
        index = self.index_of(marker)
        if index is None:  # the server's own string: the full parse names the problem
            raise _FallBack
        return self._values.get(index)

    def logprob_entries(self, marker: str) -> list[Any]:
        """The entries of a cut-out chat `logprobs.content` array (parsed only when asked for)."""
        segment = self._segment(marker)
        try:
            entries: list[Any] = orjson.loads(b"[" + segment + b"]")
        except orjson.JSONDecodeError:
            raise _FallBack from None
        return entries

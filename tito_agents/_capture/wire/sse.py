"""Server-sent events, decoded as the WHATWG spec reads them: LF, CRLF and bare CR line ends, any
split across reads, a BOM at the start; flushable to complete lines when the body ends."""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"
_START, _AFTER_CR = 1, 2
"""`SSEDecoder` states besides the usual 0: the stream's first bytes (a BOM may begin them), and
just after a chunk that ended with CR (an LF starting the next chunk ends the same line)."""


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes in, `data:` payloads out, as the WHATWG event
    stream interpretation reads them, whatever the chunk boundaries.

    Lines end with LF, CRLF or a bare CR; a CR that ends one chunk and an LF that starts the next
    are one line end (so the event is complete at the CR, as an eager client like the openai SDK
    sees it, and the LF is not a second, event-ending, blank line). Comment lines and other fields
    (`event:`, `id:`) are skipped, several `data:` lines join with LF, one leading BOM is dropped.
    `[DONE]` is reported as the payload b"[DONE]".

    Line ends are normalized to LF as bytes arrive, so events split on b"\n\n" in one C call per
    chunk; a chunk with no CR (what vLLM sends) takes no extra pass, and when every event in it is
    one `data: ` line (what vLLM sends) the payloads come out of one split, with no loop per event.
    """

    __slots__ = ("_buffer", "_state")

    def __init__(self) -> None:
        self._buffer = b""
        self._state = _START

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the data payloads of every event completed by them."""
        if self._state:
            data = self._edge(data)
        if b"\r" in data:
            if data[-1:] == b"\r":
                self._state = _AFTER_CR
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + data if self._buffer else data
        cut = buffer.rfind(b"\n\n") + 2  # the end of the last complete event
        if cut == 1:
            self._buffer = buffer
            return []
        self._buffer = buffer[cut:]
        n = buffer.count(b"\n\n", 0, cut)
        if (  # the usual stream: each event one "data: " line (a few C calls for all of them)
            buffer.startswith(b"data: ")
            and buffer.count(b"\n", 0, cut) == 2 * n
            and buffer.count(b"\n\ndata: ", 0, cut) == n - 1
        ):
            return buffer[6 : cut - 2].split(b"\n\ndata: ")
        events = buffer[: cut - 2].split(b"\n\n")
        out: list[bytes] = []
        for event in events:
            if event[:6] == b"data: " and b"\n" not in event:
                out.append(event[6:])  # the usual event: one "data: " line
            elif event:
                payload = _event_data(event)
                if payload is not None:
                    out.append(payload)
        return out

    def _edge(self, data: bytes) -> bytes:
        """`data` without what belongs to the state: a leading BOM, or the LF of a CRLF whose CR
        ended the previous chunk. Rare, so kept off the per-chunk path."""
        if self._state == _AFTER_CR:
            if not data:
                return data  # an empty read: the next byte may still be that LF
            self._state = 0
            return data[1:] if data[:1] == b"\n" else data
        head = self._buffer + data  # the stream's first bytes, fewer than 3 so far
        if len(head) < 3 and _BOM.startswith(head):
            self._buffer = head  # too short to know whether a BOM begins the stream
            return b""
        self._state, self._buffer = 0, b""
        return head[3:] if head.startswith(_BOM) else head

    def flush(self, *, complete_lines: bool = False) -> list[bytes]:
        """The payload of the event left pending, as if a blank line followed.

        At the end of the body (default) its last line counts even without a line end (lenient: a
        server may omit the final newline). When the caller closes the stream early
        (`complete_lines`), only lines whose end arrived count: a client that reads lines, such as
        one that stops at the line `data: [DONE]`, may close before the blank line that follows."""
        rest, self._buffer = self._buffer, b""
        if self._state == _START:
            self._state = 0
            rest = rest.removeprefix(_BOM)  # the partial BOM itself cannot end a line
        if complete_lines:
            rest = rest[: rest.rfind(b"\n") + 1]
        payload = _event_data(rest) if rest else None
        return [payload] if payload is not None else []


def _event_data(event: bytes) -> bytes | None:
    """The data of one event (its lines, LF-separated), or None when it has no `data` field.

    A line is a field `name:value` (one space after the colon is dropped) or a bare `name`; only
    `data` fields count; lines starting with ":" are comments."""
    data: bytes | None = None
    for line in event.split(b"\n"):
        if line[:5] == b"data:":
            value = line[6:] if line[5:6] == b" " else line[5:]
        elif line == b"data":
            value = b""
        else:
            continue
        data = value if data is None else data + b"\n" + value
    return data

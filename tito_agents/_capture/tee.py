"""The stream tee: watches an SSE response pass to the caller, decodes its events and records
the call when the stream ends or the caller closes it; never buffers what the caller reads."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from tito_agents._capture.pending import PendingCall
from tito_agents._capture.wire import (
    ParsedChoice,
    ResponseParser,
    SSEDecoder,
)
from tito_agents.errors import (
    CaptureError,
    IncompleteCallError,
    MalformedResponseError,
)

HOLD_BYTES = 32 << 10
"""How many bytes of a stream the tee holds before decoding them (see `StreamTee.feed`)."""
logger = logging.getLogger(__name__)


class Recorder(Protocol):
    """What the tee needs of the capture core: turning parsed choices into call records."""

    def record(
        self,
        pending: PendingCall,
        parser: ResponseParser,
        choices: list[ParsedChoice],
        status: int,
        *,
        stream: bool,
        incomplete: CaptureError | None = None,
    ) -> None: ...


class Decompressor(Protocol):
    """Incremental decoding of a compressed body, as the transport's HTTP library does it."""

    def decode(self, data: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


def undecodable(encoding: str) -> MalformedResponseError:
    return MalformedResponseError(
        f"the server sent the body with content-encoding {encoding!r} although capture asked for "
        "'identity', and the HTTP client has no decoder for it.",
        fix="make the server or proxy honour accept-encoding: identity for vLLM hosts",
    )


def unreadable_stream(exc: Exception) -> MalformedResponseError:
    """A fault of the stream's decoding that is no `CaptureError` (a shape the parser did not
    expect): the call is unusable; the caller's stream goes on as the server sent it."""
    logger.warning("could not parse a captured stream", exc_info=exc)
    return MalformedResponseError(f"unreadable stream ({exc!r})")


def failed_choice(error: CaptureError) -> ParsedChoice:
    return ParsedChoice(
        index=0,
        prompt_ids=None,
        sampled_ids=None,
        logprobs=None,
        finish_reason=None,
        stop_reason=None,
        error=error,
    )


class StreamTee:
    """Watches an SSE response pass by: decodes events, accumulates ids per choice, never buffers
    what the caller reads. `end()` on a clean end of stream, `close()` when the caller closes."""

    __slots__ = (
        "_core",
        "_decoder",
        "_decompressor",
        "_done",
        "_error",
        "_held",
        "_held_bytes",
        "_may_end",
        "_parser",
        "_pending",
        "_refused",
        "_status",
    )

    def __init__(
        self,
        core: Recorder,
        pending: PendingCall,
        status: int,
        decompressor: Decompressor | None = None,
        refused: CaptureError | None = None,
    ) -> None:
        self._core = core
        self._pending = pending
        self._status = status
        self._parser = ResponseParser(pending.info)
        self._decoder = SSEDecoder()
        self._decompressor = decompressor
        self._refused = refused
        """Why this stream cannot be read at all (recorded at its first byte, end or close)."""
        self._done = False
        self._error: CaptureError | None = None
        self._held: list[bytes] = []
        """Chunks not decoded yet (at most `HOLD_BYTES`; see `feed`)."""
        self._held_bytes = 0
        self._may_end = self._parser.STREAM_END.search

    def feed(self, data: bytes) -> None:
        """Absorb one raw chunk. Raises only under `ErrorMode.RAISE`.

        Chunks are held (a list append) and decoded together once `HOLD_BYTES` are held, when a
        chunk may end the stream (it holds `[DONE]`, or the type of a Responses final event), and
        at `end`/`close`: one decoding pass over many events instead of one per token, which
        costs a fraction (a proxy relaying a stream spends most of its own CPU here). What the
        caller reads is never held; the call is still recorded before a `[DONE]` chunk reaches it.
        """
        if self._error is not None or self._pending.finished:
            return
        if self._pending.first_byte_at is None:
            self._pending.first_byte_at = time.time()
            if self._refused is not None:
                self._fail(self._refused)
                return
        self._held.append(data)
        self._held_bytes += len(data)
        if (
            self._held_bytes >= HOLD_BYTES
            or self._decompressor is not None  # marks cannot be seen in compressed bytes
            or self._may_end(data) is not None
        ):
            self._decode()

    def _decode(self) -> None:
        """Decode the held chunks; record the call when its final event is among them."""
        data = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        try:
            if self._decompressor is not None:
                data = self._decompress(data, flush=False)
            self._absorb(self._decoder.feed(data))
        except CaptureError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # never break the caller's iteration: the call is unusable
            self._fail(unreadable_stream(exc))
            return
        if self._done:
            self._complete()

    def _decompress(self, data: bytes, *, flush: bool) -> bytes:
        decompressor = self._decompressor
        assert decompressor is not None
        try:
            out = decompressor.decode(data)
            return out + decompressor.flush() if flush else out
        except Exception as exc:  # the library's own decoding error, whatever its type
            raise MalformedResponseError(f"the compressed stream does not decode: {exc}") from exc

    def _absorb(self, payloads: list[bytes]) -> None:
        """Feed decoded event payloads to the parser; note the end of the stream (`[DONE]`, or a
        Responses final event, which comes without it)."""
        if payloads and self._parser.feed_payloads(payloads):
            self._done = True

    def _fail(self, error: CaptureError) -> None:
        self._error = error
        self._core.record(
            self._pending, self._parser, [failed_choice(error)], self._status, stream=True
        )

    def end(self) -> None:
        """The inner stream ended cleanly. Complete only if `[DONE]` arrived."""
        if self._pending.finished:
            return
        if self._refused is not None:
            self._fail(self._refused)
            return
        self._decode()
        if self._pending.finished:  # failed, or complete at its final event
            return
        try:
            tail = self._decompress(b"", flush=True) if self._decompressor is not None else b""
            self._absorb(self._decoder.feed(tail) + self._decoder.flush())
        except CaptureError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # never break the caller's iteration: the call is unusable
            self._fail(unreadable_stream(exc))
            return
        if not self._done:
            self.close(
                reason="the stream ended without its final event ([DONE], response.completed)"
            )
            return
        self._complete()

    def _complete(self) -> None:
        if self._pending.finished:
            return
        try:
            choices = self._parser.finish_stream()
        except Exception as exc:  # never break the caller's iteration: the call is unusable
            self._fail(unreadable_stream(exc))
            return
        self._core.record(self._pending, self._parser, choices, self._status, stream=True)

    def close(self, reason: str = "the caller closed the stream before it finished") -> None:
        """The caller closed, cancelled or broke off the stream: record it as incomplete, unless
        `[DONE]` is in what arrived. A caller may stop at `[DONE]` before the bytes that end its
        event are read (a CR's LF, the blank line after `data: [DONE]`): what arrived is read to
        its last complete line first, so a finished stream is never incomplete."""
        if self._pending.finished:
            return
        if self._refused is not None:
            self._fail(self._refused)
            return
        self._decode()  # the complete events held: a broken one fails the call, as at feed
        if self._pending.finished:
            return
        try:
            self._absorb(self._decoder.flush(complete_lines=True))
        except CaptureError:
            pass  # a broken event in what is left of an abandoned stream: it is incomplete
        except Exception as exc:  # never break the caller's close: the call is unusable
            self._fail(unreadable_stream(exc))
            return
        if self._done:
            self._complete()
            return
        try:
            choices = self._parser.finish_stream()
        except Exception as exc:  # never break the caller's close: the call is unusable
            self._fail(unreadable_stream(exc))
            return
        # a chunk that arrived malformed makes the call unusable, abandoned or not
        malformed = [c.error for c in choices if isinstance(c.error, MalformedResponseError)]
        if malformed:
            self._fail(malformed[0])
            return
        choices = choices or [failed_choice(IncompleteCallError(reason))]
        for choice in choices:
            choice.sampled_ids = None
        self._core.record(
            self._pending,
            self._parser,
            choices,
            self._status,
            stream=True,
            incomplete=IncompleteCallError(reason),
        )

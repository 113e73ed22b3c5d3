"""The stream tee: watches an SSE response pass to the caller, decodes its events and records
the call when the stream ends or the caller closes it; never buffers what the caller reads."""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

import orjson

from tito_agents._capture.pending import PendingCall
from tito_agents._wire import (
    ParsedChoice,
    ResponseParser,
    SSEDecoder,
)
from tito_agents.errors import (
    CaptureError,
    IncompleteCallError,
    MalformedResponseError,
)


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

    def feed(self, data: bytes) -> None:
        """Absorb one raw chunk. Raises only under `ErrorPolicy.RAISE`."""
        if self._error is not None or self._pending.finished:
            return
        if self._pending.first_byte_at is None:
            self._pending.first_byte_at = time.time()
            if self._refused is not None:
                self._fail(self._refused)
                return
        try:
            if self._decompressor is not None:
                data = self._decompress(data, flush=False)
            self._absorb(self._decoder.feed(data))
        except CaptureError as exc:
            self._fail(exc)
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
        """Feed decoded event payloads to the parser (a loop here, not a call per event: this
        runs once per streamed token)."""
        feed_event = self._parser.feed_event
        for payload in payloads:
            if payload == b"[DONE]":
                self._done = True  # the server finished: record now, before the caller sees it
                continue
            try:
                event = orjson.loads(payload)
            except orjson.JSONDecodeError as exc:
                raise MalformedResponseError(f"SSE event is not valid JSON: {exc}") from exc
            feed_event(event)
        if self._parser.done:  # a Responses stream ends with its final event, without [DONE]
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
        try:
            tail = self._decompress(b"", flush=True) if self._decompressor is not None else b""
            self._absorb(self._decoder.feed(tail) + self._decoder.flush())
        except CaptureError as exc:
            self._fail(exc)
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
        choices = self._parser.finish_stream()
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
        # a broken event in what is left of an abandoned stream: the stream is incomplete
        with contextlib.suppress(CaptureError):
            self._absorb(self._decoder.flush(complete_lines=True))
        if self._done:
            self._complete()
            return
        choices = self._parser.finish_stream() or [failed_choice(IncompleteCallError(reason))]
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

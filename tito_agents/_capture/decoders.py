"""The content decoders of a response, as the HTTP library inside the client applies them (for
the capture flow and its stream tee, which read what the caller's client decodes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["content_decoders"]


def _joined(out: bytes | Iterable[bytes]) -> bytes:
    return out if isinstance(out, bytes) else b"".join(out)


class _Decoders:
    """The content decoders of one response as one incremental decoder for the stream tee.

    They are the HTTP library's own (its private `_decoders`), so capture reads exactly what the
    caller's client decodes from the same bytes. Encodings apply in the order listed, so the last
    is undone first. httpx's decoders return bytes, httpx2's yield bounded pieces: both are read
    as bytes here."""

    __slots__ = ("_chain",)

    def __init__(self, decoders: list[Any]) -> None:
        self._chain = decoders[::-1]

    def decode(self, data: bytes) -> bytes:
        for decoder in self._chain:
            data = _joined(decoder.decode(data))
        return data

    def flush(self) -> bytes:
        data = b""
        for decoder in self._chain:
            data = _joined(decoder.decode(data)) + _joined(decoder.flush())
        return data


def content_decoders(module: Any, response: Any) -> tuple[_Decoders | None, str | None]:
    """For a body a server compressed although capture asked for `identity`: (its decoder, None),
    or (None, the encoding the HTTP library cannot decode, which it would pass on undecoded)."""
    supported = getattr(getattr(module, "_decoders", None), "SUPPORTED_DECODERS", None) or {}
    decoders = []
    for name in response.headers.get_list("content-encoding", split_commas=True):
        name = name.strip().lower()
        if name in ("", "identity"):
            continue
        try:
            decoders.append(supported[name]())
        except Exception:  # unknown here, or a library whose decoders take arguments
            return None, name
    return (_Decoders(decoders) if decoders else None), None

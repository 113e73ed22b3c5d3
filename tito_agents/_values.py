"""Values users hand the library, made storable once: identifiers as strings, and free-form JSON
(metadata, labels) that every sink can write.

Users pass step counters as ids and version labels (`group_id=3`, `policy_version=np.int64(7)`)
and numpy scalars or arrays in metadata and labels. Every sample file format keeps identifiers in
string columns and metadata as JSON, so before this module a Parquet or Arrow sink refused each
such sample, and the spill log of refused samples raised in the delivery thread and stopped it.
Identifiers are made strings where they enter (`as_text`), and everything written as JSON goes
through `json_bytes`, which writes numpy values as numbers and lists and any other object as its
`str()`, so no value a user can put in metadata makes a sink refuse a sample.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import orjson

__all__ = ["as_text", "json_bytes"]

_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def as_text(value: Any, what: str) -> str | None:
    """`value` as an identifier: a string or None as given, an int (numpy's too, not a bool) as its
    decimal string. Raises ValueError for anything else (a float, a list): it has no one spelling
    a reader could match."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_):
        return str(int(value))
    raise ValueError(f"{what} must be a string (or an int), got {value!r}")


def json_bytes(value: Any, option: int = 0) -> bytes:
    """`value` as JSON for a sink: numpy arrays and scalars as lists and numbers, non-string keys
    as strings, sets as lists, and any other object orjson cannot write as its `str()`."""
    return orjson.dumps(value, default=_jsonable, option=_JSON_OPTIONS | option)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):  # scalars OPT_SERIALIZE_NUMPY leaves out (np.bool_, ...)
        return value.item()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)

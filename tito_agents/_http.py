"""The HTTP library: httpx2 (which openai >= 3 builds its clients on) or httpx (before it).

The one place that picks it, so capture, re-scoring, the `--logprobs-mode` probe and the gateway
all speak the same library as the openai SDK they sit beside (the two share an API, not their
classes: a transport or an exception of one is no instance of the other's).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

__all__ = ["http_module", "http_module_of", "is_http_client"]

_LIBRARIES = ("httpx2", "httpx")
"""Most recent first: httpx2 is installed only by an openai SDK that uses it."""


@functools.cache
def http_module() -> ModuleType:
    """The HTTP library for requests of tito's own (re-scoring, probes): httpx2 where it is
    installed, else httpx. Raises ImportError when neither is (both come with openai)."""
    for name in _LIBRARIES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("tito_agents needs httpx2 or httpx (installed with the openai package)")


def http_module_of(http_client: Any) -> ModuleType:
    """The library an HTTP client instance comes from (httpx or httpx2): a client's transport is
    wrapped with that library's classes."""
    for klass in type(http_client).__mro__:
        root = klass.__module__.split(".")[0]
        if root in _LIBRARIES:
            return importlib.import_module(root)
    raise TypeError(f"{type(http_client).__name__} is not an httpx or httpx2 client")


def is_http_client(obj: Any) -> bool:
    """Whether `obj` is an httpx or httpx2 client (sync or async) itself, not a client of an API
    built on one."""
    for klass in type(obj).__mro__:
        module = klass.__module__.split(".")[0]
        if module in _LIBRARIES and klass.__name__ in ("Client", "AsyncClient"):
            return True
    return False

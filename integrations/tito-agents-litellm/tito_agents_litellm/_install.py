"""`install`: every HTTP client LiteLLM sends a chat call through captures it.

LiteLLM reaches vLLM two ways, and neither takes one client from the user for every call:

* `hosted_vllm/...` goes through LiteLLM's own `HTTPHandler` / `AsyncHTTPHandler`, cached in
  `litellm.in_memory_llm_clients_cache` (and the module-level `litellm.module_level_client` /
  `module_level_aclient`), async ones over an aiohttp transport by default. They ignore
  `litellm.client_session` / `aclient_session`.
* `openai/...` builds (and caches) an `openai.OpenAI` / `AsyncOpenAI` in
  `OpenAIChatCompletion._get_openai_client`, or uses the one passed as `client=`.

Every request of the first kind reads the handler's `client` property, and every one of the
second gets its SDK client from `_get_openai_client`. `install` hooks those two places, so a
client is captured when it is used, whenever it was built: before `install` (the cache), by the
user (`client=`), or healed after being closed. The httpx client is wrapped in place
(`Collector.wrap`), so LiteLLM keeps its own transport (aiohttp included), proxies, limits and
ownership. `uninstall` puts back the two hooks and the transports it wrapped.
"""

from __future__ import annotations

import importlib.metadata
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpx
import litellm
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from tito_agents import Collector, ConfigurationError
from tito_agents_litellm._check import ModelCallCounter

SUPPORTED_LITELLM = ">=1.110,<1.111"
"""The litellm releases the hooks are tested on (1.110.2); others are refused, not half-captured."""


def check_litellm_version(version: str | None = None) -> None:
    """Raise `ConfigurationError` naming the supported releases unless `version` (default: the
    installed litellm's) is one of them."""
    if version is None:
        version = importlib.metadata.version("litellm")
    try:
        supported = SpecifierSet(SUPPORTED_LITELLM).contains(Version(version))
    except InvalidVersion:
        supported = False
    if not supported:
        raise ConfigurationError(
            f"litellm {version} is not supported by tito-agents-litellm: it hooks LiteLLM's HTTP "
            f"handlers, which are no public API; supported: litellm {SUPPORTED_LITELLM} "
            f"(pip install 'litellm{SUPPORTED_LITELLM}')"
        )


def _internals() -> tuple[tuple[type[Any], ...], type[Any]]:
    """The LiteLLM classes the hooks go into: its two HTTP handlers, and the `openai/` route's
    `OpenAIChatCompletion`. Imported once the release is known to have them."""
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler, HTTPHandler
    from litellm.llms.openai.openai import OpenAIChatCompletion

    return (HTTPHandler, AsyncHTTPHandler), OpenAIChatCompletion


class LiteLLMCapture:
    """What `install` set up; `uninstall()` (or leaving a `with` block) undoes it.

    `collector` records the calls; `vllm_hosts` are the hosts whose calls get vLLM's ids (any
    other host LiteLLM talks to passes through untouched).
    """

    def __init__(self, collector: Collector, vllm_hosts: frozenset[str], sessions: bool) -> None:
        self.collector = collector
        self.vllm_hosts = vllm_hosts
        self._sessions = sessions
        self._lock = threading.Lock()
        self._wrapped: weakref.WeakSet[Any] = weakref.WeakSet()
        self._originals: dict[int, tuple[weakref.ref[Any], Any, Any]] = {}
        """Per wrapped client (by id): the client (weakly) and the transports it had. An entry goes
        when its client does, so no transport outlives the client LiteLLM dropped it with."""
        self._restore: list[Callable[[], None]] = []

    @property
    def installed(self) -> bool:
        return bool(self._restore)

    def capture(self, http_client: Any) -> None:
        """Wrap an httpx client LiteLLM is about to send through (once; cheap after that)."""
        if http_client is None or http_client in self._wrapped:
            return
        with self._lock:
            if http_client in self._wrapped:
                return
            # httpx keeps its transports in `_transport` / `_mounts`: kept to put back on uninstall
            transport = http_client._transport
            mounts = dict(getattr(http_client, "_mounts", {}) or {})
            self.collector.wrap(http_client, vllm_hosts=self.vllm_hosts, sessions=self._sessions)
            key = id(http_client)
            originals = self._originals
            ref = weakref.ref(http_client, lambda _: originals.pop(key, None))
            originals[key] = (ref, transport, mounts)
            self._wrapped.add(http_client)

    def _hook(self) -> None:
        handlers, chat_completion = _internals()
        for handler in handlers:
            self._hook_client_property(handler)
        self._hook_openai_client(chat_completion)
        self._count_model_calls()

    def _hook_client_property(self, handler: type[Any]) -> None:
        """`handler.client` hands back a captured httpx client (LiteLLM reads it per request)."""
        original = handler.__dict__["client"]
        capture = self.capture

        def client(self: Any) -> Any:
            http_client = original.fget(self)
            capture(http_client)
            return http_client

        handler.client = property(client, original.fset, original.fdel, original.__doc__)
        self._restore.append(lambda: setattr(handler, "client", original))

    def _hook_openai_client(self, chat_completion: type[Any]) -> None:
        """The `openai/` route's SDK client (new, cached or the caller's) sends through a captured
        httpx client."""
        original = chat_completion.__dict__["_get_openai_client"]
        capture = self.capture

        def _get_openai_client(self: Any, *args: Any, **kwargs: Any) -> Any:
            sdk_client = original(self, *args, **kwargs)
            capture(getattr(sdk_client, "_client", None))
            return sdk_client

        chat_completion._get_openai_client = _get_openai_client
        self._restore.append(lambda: setattr(chat_completion, "_get_openai_client", original))

    def _count_model_calls(self) -> None:
        """Each call LiteLLM sends to vLLM is counted in its episode (see `_check`)."""
        counter = ModelCallCounter(self.vllm_hosts)
        callbacks = litellm.logging_callback_manager
        callbacks.add_litellm_callback(counter)
        # LiteLLM copies `litellm.callbacks` into its per-event lists on the next call
        self._restore.append(lambda: callbacks.remove_callback_from_all_lists(counter))

    def uninstall(self) -> None:
        """Put LiteLLM back: the two hooks, and the transports of every client wrapped (calls
        from now on are not captured). Idempotent."""
        global _ACTIVE
        with self._lock:
            while self._restore:
                self._restore.pop()()
            for ref, transport, mounts in list(self._originals.values()):
                http_client = ref()
                if http_client is not None:
                    http_client._transport = transport
                    if mounts:
                        http_client._mounts = mounts
            self._originals.clear()
            self._wrapped = weakref.WeakSet()
        with _INSTALL:
            if _ACTIVE is self:
                _ACTIVE = None

    def __enter__(self) -> LiteLLMCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def _host(entry: str) -> str:
    """A `vllm_hosts` entry as capture matches it ("host" or "host:port"): a URL gives its own."""
    entry = entry.strip().lower()
    return urlsplit(entry).netloc if "://" in entry else entry


_INSTALL = threading.Lock()
_ACTIVE: LiteLLMCapture | None = None


def install(
    collector: Collector, *, vllm_hosts: Iterable[str], sessions: bool = False
) -> LiteLLMCapture:
    """Capture every `litellm.completion` / `acompletion` call to `vllm_hosts` with `collector`:
    `hosted_vllm/` and `openai/` models, sync and async, streaming or not, through clients LiteLLM
    built before or after this call, or one passed as `client=`.

    vllm_hosts: the hosts that run vLLM: "host", "host:port", or the `api_base` URL itself.
    sessions: token-in sessions for these calls (see `tito_agents.sessions`).

    One install at a time: installing again uninstalls the previous one first. Returns the handle
    (`uninstall()`, or use it as a context manager). Raises `ConfigurationError` for a litellm
    release outside `SUPPORTED_LITELLM`.
    """
    global _ACTIVE
    check_litellm_version()
    hosts = frozenset(_host(entry) for entry in vllm_hosts if entry.strip())
    if not hosts:
        raise ConfigurationError("install() needs vllm_hosts: the host:port of each vLLM server")
    with httpx.Client() as probe:  # the hosts are checked now, not at the first call
        collector.wrap(probe, vllm_hosts=hosts)
    with _INSTALL:
        previous = _ACTIVE
    if previous is not None:
        previous.uninstall()
    capture = LiteLLMCapture(collector, hosts, sessions)
    capture._hook()
    with _INSTALL:
        _ACTIVE = capture
    return capture

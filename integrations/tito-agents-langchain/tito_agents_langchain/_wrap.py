"""`wrap(llm, collector)`: make an existing `ChatOpenAI` capture through the tito-agents transport.

langchain-openai keeps only whitelisted response fields, so vLLM's `prompt_token_ids` / `token_ids`
never reach LangChain objects; capture has to sit below it, in the HTTP client of the openai clients
`ChatOpenAI` holds. Every call path ends in one of two root clients: `invoke`, `stream`, `batch`
and `bind_tools` in `client` / `async_client` (the `chat.completions` resources of `root_client` /
`root_async_client`), `with_structured_output` and streamed `response_format` in the root clients
themselves. So `wrap` replaces both root clients (and their resources) with copies whose HTTP
client captures.

The copies get HTTP clients of their own that reuse the connection pool (transport and proxy mounts)
of the ones they replace: langchain-openai shares one cached default HTTP client between every model
with the same base URL, and capturing it in place would capture, and re-route, the other models too.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any, TypeVar

import openai
from langchain_core.callbacks import BaseCallbackManager
from langchain_openai.chat_models.base import BaseChatOpenAI

from tito_agents import Collector, ConfigurationError
from tito_agents_langchain import _attribution
from tito_agents_langchain._scopes import ModelRunMarker

ChatModelT = TypeVar("ChatModelT", bound=BaseChatOpenAI)

_ROOTS = (("root_client", "client", False), ("root_async_client", "async_client", True))

# A replaced HTTP client stays alive as long as the copy that shares its pool: langchain-openai's
# non-cached clients close their transport when garbage-collected.
_pool_owners: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def wrap(
    llm: ChatModelT, collector: Collector, *, vllm_hosts: Iterable[str] | None = None
) -> ChatModelT:
    """Capture every chat completion `llm` (a `ChatOpenAI` pointed at vLLM) makes; in place.

    Covers `invoke` / `ainvoke`, `stream` / `astream`, `batch` / `abatch`, `bind_tools`,
    `with_structured_output` and every runnable built on `llm` afterwards or before (they hold the
    same instance). Pins the model to the chat-completions API (`use_responses_api=False`): vLLM's
    Responses endpoint returns no token ids. `vllm_hosts` defaults to the host of the model's base
    URL. Wrapping again (e.g. with another collector) replaces the capture; it never stacks.
    Returns `llm` for one-line use. Raises `ConfigurationError` for a model set up for the
    Responses API or pointed at the official OpenAI API.
    """
    if not isinstance(llm, BaseChatOpenAI):
        raise ConfigurationError(
            f"wrap() expects a langchain_openai ChatOpenAI (pointed at vLLM), got "
            f"{type(llm).__name__}; wrap the model itself: runnables built on it (bind_tools, "
            "with_structured_output, ...) capture too, before or after wrap()"
        )
    if llm.use_responses_api:
        raise ConfigurationError(
            "this ChatOpenAI uses the Responses API (use_responses_api=True, "
            "output_version='responses/v1', or reasoning/include/truncation settings), but "
            "vLLM's /v1/responses endpoint has no return_token_ids: the sampled token ids are "
            "unavailable there. Use the chat-completions API: ChatOpenAI(..., "
            "use_responses_api=False) without Responses-only settings."
        )
    hosts = list(vllm_hosts) if vllm_hosts is not None else None
    replaced: dict[str, Any] = {}
    for root_name, resource_name, asynchronous in _ROOTS:
        root = getattr(llm, root_name)
        if root is None:  # langchain-openai leaves the sync client unset without a sync api key
            continue
        capturing = root.with_options(http_client=_pool_sharing_copy(root._client, asynchronous))
        collector.wrap(capturing, vllm_hosts=hosts)
        replaced[root_name] = capturing
        replaced[resource_name] = capturing.chat.completions
    if not replaced:
        raise ConfigurationError("this ChatOpenAI has no openai client to wrap")
    for name, value in replaced.items():
        setattr(llm, name, value)
    llm.use_responses_api = False  # per-call arguments can no longer route it to /v1/responses
    _mark(llm, collector)
    _attribution.install()
    return llm


def _pool_sharing_copy(http_client: Any, asynchronous: bool) -> Any:
    """A new HTTP client of the openai SDK's library over `http_client`'s connection pool."""
    cls = openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient
    mounts = {pattern.pattern: transport for pattern, transport in http_client._mounts.items()}
    copy = cls(
        transport=http_client._transport,
        mounts=mounts,
        timeout=http_client.timeout,
        headers=http_client.headers,
        event_hooks=http_client.event_hooks,
        follow_redirects=http_client.follow_redirects,
        trust_env=False,  # proxies from the environment are already in the copied mounts
    )
    _pool_owners[copy] = _pool_owners.get(http_client, http_client)
    return copy


def _mark(llm: BaseChatOpenAI, collector: Collector) -> None:
    """Put one `ModelRunMarker` for `collector` among the model's own callbacks."""
    marker = ModelRunMarker(collector)
    callbacks = llm.callbacks
    if isinstance(callbacks, BaseCallbackManager):
        for handler in list(callbacks.handlers):
            if isinstance(handler, ModelRunMarker):
                callbacks.remove_handler(handler)
        callbacks.add_handler(marker, inherit=False)
        return
    kept = [h for h in callbacks or [] if not isinstance(h, ModelRunMarker)]
    llm.callbacks = [*kept, marker]

"""LiteLLM's model calls counted per episode, so a call that went around capture is never silent.

A `CustomLogger` whose pre-call hook LiteLLM runs in the caller's context, once per call it is
about to send (the episode's contextvars are there, in threads and executors too). At the
episode's end the collector compares the count with the requests capture sent, and logs and
counts the difference (`collector.stats.bypassed_calls`, `EpisodeReport.bypassed_calls`) with the
fix: a `vllm_hosts` entry that does not match the `api_base`, a client LiteLLM reached that the
hooks did not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from litellm.integrations.custom_logger import CustomLogger

from tito_agents.integration import current_episode

FRAMEWORK = "LiteLLM"
"""How this integration names its framework to the core (`Episode.note_model_call`): the name
the core's list of framework fixes knows it by, so a miss is logged with LiteLLM's fix."""

VLLM_PROVIDER = "hosted_vllm"
"""LiteLLM's provider name for vLLM: its calls always go to a vLLM server."""


class ModelCallCounter(CustomLogger):
    """Counts each call LiteLLM sends to vLLM (a `hosted_vllm/` model, or any model whose
    `api_base` is one of `vllm_hosts`) in the episode of its caller."""

    def __init__(self, vllm_hosts: frozenset[str]) -> None:
        super().__init__()
        self.vllm_hosts = vllm_hosts

    def log_pre_api_call(self, model: str, messages: Any, kwargs: Mapping[str, Any]) -> None:
        if not self.goes_to_vllm(kwargs):
            return
        episode = current_episode()
        if episode is not None:
            episode.note_model_call(FRAMEWORK)

    def goes_to_vllm(self, kwargs: Mapping[str, Any]) -> bool:
        params = kwargs.get("litellm_params") or {}
        if (
            kwargs.get("custom_llm_provider") or params.get("custom_llm_provider")
        ) == VLLM_PROVIDER:
            return True
        api_base = params.get("api_base") or kwargs.get("api_base")
        if not api_base:
            return False
        parts = urlsplit(str(api_base))
        host = (parts.hostname or "").lower()
        return host in self.vllm_hosts or f"{host}:{parts.port}" in self.vllm_hosts

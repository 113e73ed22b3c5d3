"""LangChain retries and fallbacks, and openai SDK retries, never duplicate samples: failed attempts
are not calls, and each real response is recorded once."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from lc_support import MakeModel
from tito_agents_langchain import TitoCallbackHandler, call_id_of, wrap

import tito_agents as tito
from tito_agents.testing import captured_samples
from tito_agents.testing.fake_vllm import FAULT_HEADER, FakeVLLMServer


def samples_of(collector: tito.Collector) -> list[tito.Sample]:
    return captured_samples(collector)


class HealOnError(BaseCallbackHandler):
    """Turns the fake's stream cut off when a model run fails: the retried attempt succeeds."""

    run_inline = True

    def __init__(self, server: FakeVLLMServer) -> None:
        self.server = server
        self.errors = 0

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.errors += 1
        self.server.faults.cut_stream_after = None


async def test_with_retry_after_a_server_error_writes_one_sample(
    make_model: MakeModel, collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """A 503 retried by with_retry() is a failed attempt, not a call: one sample."""
    handler = TitoCallbackHandler(collector)
    llm = wrap(make_model(max_retries=0), collector).with_retry(
        stop_after_attempt=3, wait_exponential_jitter=False
    )
    fake_server.fail_next(1, status=503)
    message = await llm.ainvoke("Hello there.", config={"callbacks": [handler]})
    (sample,) = samples_of(collector)
    assert sample.call_ids == [call_id_of(message)]
    assert collector.stats.failed_attempts == 1 and fake_server.stats.statuses[503] == 1


async def test_openai_sdk_retries_write_one_sample(
    make_model: MakeModel, collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """The openai SDK's own retries (429 with retry-after) end in one call and one sample."""
    handler = TitoCallbackHandler(collector)
    llm = wrap(make_model(max_retries=3), collector)
    fake_server.fail_next(2, status=429, retry_after_ms=1)
    await llm.ainvoke("Hello there.", config={"callbacks": [handler]})
    assert len(samples_of(collector)) == 1 and collector.stats.failed_attempts == 2


async def test_with_fallbacks_writes_only_the_fallback_sample(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """A primary model that fails falls back to another wrapped model: one sample, from it."""
    failing = make_model(max_retries=0, default_headers={FAULT_HEADER: "status_before_body=500"})
    primary = wrap(failing, collector)
    fallback = wrap(make_model(), collector)
    handler = TitoCallbackHandler(collector)
    message = await primary.with_fallbacks([fallback]).ainvoke(
        "Hello there.", config={"callbacks": [handler]}
    )
    (sample,) = samples_of(collector)
    assert isinstance(message, AIMessage) and sample.call_ids == [call_id_of(message)]
    assert collector.stats.failed_attempts == 1


async def test_a_broken_stream_retried_writes_one_sample(
    make_model: MakeModel, collector: tito.Collector, fake_server: FakeVLLMServer
) -> None:
    """A stream cut mid-way is an incomplete call, never a sample; the retry's call is the one."""
    heal = HealOnError(fake_server)
    handler = TitoCallbackHandler(collector)
    llm = wrap(make_model(streaming=True, max_retries=0), collector)
    fake_server.faults.cut_stream_after = 3
    message = await llm.with_retry(stop_after_attempt=2, wait_exponential_jitter=False).ainvoke(
        "Hello there.", config={"callbacks": [handler, heal]}
    )
    assert heal.errors == 1
    (sample,) = samples_of(collector)
    assert sample.call_ids == [call_id_of(message)]
    assert collector.stats.incomplete_calls == 1 and collector.stats.complete_calls == 1


async def test_a_chain_retried_after_a_good_response_keeps_both_real_calls(
    make_model: MakeModel, collector: tito.Collector
) -> None:
    """When the model answered but a later step failed, the retry samples again: two different
    responses, two samples, no duplicate."""
    attempts: list[int] = []

    def picky(message: Any) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("unparseable")
        return message

    handler = TitoCallbackHandler(collector)
    llm = wrap(make_model(temperature=1.0), collector)
    chain = (llm | RunnableLambda(picky)).with_retry(
        stop_after_attempt=2, wait_exponential_jitter=False
    )
    await chain.ainvoke("Hello there.", config={"callbacks": [handler]})
    samples = samples_of(collector)
    assert len(samples) == 2 and len({s.call_ids[0] for s in samples}) == 2
    assert collector.stats.duplicate_calls == 0

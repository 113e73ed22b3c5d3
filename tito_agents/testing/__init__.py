"""Test helpers shipped with tito-agents: the real SmolLM2 tokenizer, offline, a fake vLLM, and a
typed read of what a test's collector captured.

    from tito_agents.testing import FakeConfig, FakeVLLMServer, captured_samples, load_tokenizer

* `load_tokenizer()` / `tokenizer_dir()`: SmolLM2-135M-Instruct's tokenizer, whose files ship in
  the package (`data/smollm2`, Apache-2.0; see `tito_agents.testing.smollm2`).
* `FakeVLLM` / `FakeVLLMServer` / `mock_transport`: a fake vLLM 0.32 server, byte-faithful on the
  wire, with deterministic scriptable generation and fault switches, over HTTP or in process (see
  `tito_agents.testing.fake_vllm`).
* `captured_samples(collector)`: the samples a `Collector()` kept in its default `MemorySink`, as
  `list[Sample]` (a TypeError names the sink when it is another kind), instead of
  `collector.sink.samples  # type: ignore`. It neither flushes nor waits: samples of calls outside
  any episode are there once `collector.flush()` returns (see `tito_agents.testing.captured`).

Needs the `testing` extra (transformers, jinja2, httpx): `pip install '.[testing]'` from a checkout.
No torch, no gguf, no model download.
"""

from __future__ import annotations

from tito_agents.testing.captured import captured_samples
from tito_agents.testing.fake_vllm import (
    FAULT_HEADER,
    FakeConfig,
    FakeResponse,
    FakeStats,
    FakeVLLM,
    FakeVLLMServer,
    Faults,
    Handler,
    RequestView,
    Responder,
    StreamCut,
    Tokenization,
    default_responder,
    hermes_tool_call,
    mock_transport,
)
from tito_agents.testing.smollm2 import (
    EOS_ID,
    IM_START_ID,
    MODEL_NAME,
    TOOLS_TEMPLATE_PATH,
    SmolLM2Unavailable,
    load_tokenizer,
    tokenizer_dir,
)

__all__ = [
    "EOS_ID",
    "FAULT_HEADER",
    "IM_START_ID",
    "MODEL_NAME",
    "TOOLS_TEMPLATE_PATH",
    "FakeConfig",
    "FakeResponse",
    "FakeStats",
    "FakeVLLM",
    "FakeVLLMServer",
    "Faults",
    "Handler",
    "RequestView",
    "Responder",
    "SmolLM2Unavailable",
    "StreamCut",
    "Tokenization",
    "captured_samples",
    "default_responder",
    "hermes_tool_call",
    "load_tokenizer",
    "mock_transport",
    "tokenizer_dir",
]

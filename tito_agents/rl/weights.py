"""New weights into a running vLLM, in place: no restart between RL steps.

Restarting vLLM on new weights costs 1-2 minutes on a 2-core CPU machine; reloading them into
the running engine costs 0.3-0.7 s for SmolLM2-135M, 0.6-2.6 s with writing the safetensors
(measured on vLLM 0.32's CPU build). vLLM can do it when the server runs with
`VLLM_SERVER_DEV_MODE=1`:

1. the trainer's state is written as safetensors into a folder of ours (`save_weights`);
2. `POST /pause?mode=wait` lets in-flight requests finish, so no answer mixes two policies;
3. `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` has every
   worker reload its weights from `DIR` in place (the CPU model runner inherits it);
4. `POST /update_weight_version {"new_version": V}` labels them, `POST /resume` lets requests in,
   and `GET /weight_info` reads back the label the engine now reports.

Without dev mode those routes do not exist (404): `WeightRoutesMissing` says so and names the
fallback, a restart on the saved folder. The routes take no API key: keep the port private.
Only the standard library speaks HTTP here (a trainer calls this synchronously after its step);
torch is imported on first use, by `save_weights` only.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tito_agents.errors import TitoError

PauseMode = Literal["wait", "keep", "abort"]
"""vLLM's `/pause` modes: finish in-flight requests first, freeze them until `/resume` (they then
continue on the new weights), or abort them."""

WEIGHTS_FILE = "model.safetensors"
MARKER_FILE = ".tito-weights"
"""Marks a folder `save_weights` owns, so it never overwrites a model folder it did not write."""
DEFAULT_TIMEOUT = 300.0

RESTART_HINT = (
    "start vLLM with VLLM_SERVER_DEV_MODE=1 in its environment to update weights in place, or, "
    "as a fallback, restart it on the saved folder (scripts/vllm_server.py: "
    "TITO_VLLM_MODEL_DIR=<folder> python3 scripts/vllm_server.py start; 1-2 minutes on a CPU)"
)


class WeightSyncError(TitoError):
    """A weight update failed on the server (its answer is in the message)."""


class WeightRoutesMissing(WeightSyncError):
    """The server has no in-place update routes: it does not run in vLLM's dev mode."""


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """What one in-place update did, and how long each part took (seconds)."""

    version: str
    """The weight version the engine reports after the update (`GET /weight_info`)."""
    previous: str | None
    """The version it reported before."""
    weights_path: Path
    save_s: float
    """Writing the safetensors (0.0 when the caller saved them)."""
    reload_s: float
    """Pause, `reload_weights` on every worker, version label, resume."""
    pause: PauseMode | None = None
    """How in-flight requests were handled (`tito_agents.rl.versions` reads a call's version
    from it and the times below)."""
    paused_at: float | None = None
    """Wall-clock time (`time.time()`, as `Call.started_at`) the pause was asked for."""
    drained_at: float | None = None
    """When `/pause` answered: with "wait" no request is in flight from here to `resumed_at`."""
    resumed_at: float | None = None
    """When `/resume` answered: requests are sampled by the new weights from here (and those
    held during the pause, by them too)."""

    @property
    def seconds(self) -> float:
        """The whole update, as a trainer waits for it."""
        return self.save_s + self.reload_s


def server_root(base_url: str) -> str:
    """`http://host:port` from a base URL with or without the OpenAI `/v1` suffix."""
    return base_url.rstrip("/").removesuffix("/v1")


class VllmWeights:
    """The weight routes of one vLLM server (`base_url` with or without `/v1`)."""

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.root = server_root(base_url)
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.root + path,
            data=data,
            method=method,
            headers={"content-type": "application/json"} if data is not None else {},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:500]
            if exc.code in (404, 405):
                raise WeightRoutesMissing(
                    f"{method} {self.root}{path}: {exc.code} (the server has no such route: it "
                    f"registers the weight routes only in dev mode); {RESTART_HINT}"
                ) from None
            raise WeightSyncError(f"{method} {self.root}{path}: {exc.code} {detail}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise WeightSyncError(f"{method} {self.root}{path}: {exc}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:  # a proxy's HTML page, or another server on that port
            raise WeightSyncError(
                f"{method} {self.root}{path}: the answer is not JSON ({raw[:200]!r}): is "
                f"{self.root} the vLLM server?"
            ) from None

    def version(self) -> str:
        """The weight version the engine reports (vLLM starts at "default")."""
        answer = self._call("GET", "/weight_info")
        version = answer.get("weight_version") if isinstance(answer, dict) else None
        if version is None:  # str(None) would be taken for a version label
            raise WeightSyncError(
                f"GET {self.root}/weight_info answered {answer!r}, expected "
                '{"weight_version": ...}: is it a vLLM server in dev mode?'
            )
        return str(version)

    def pause(self, mode: PauseMode = "wait") -> None:
        self._call("POST", f"/pause?mode={mode}")

    def resume(self) -> None:
        self._call("POST", "/resume")

    def set_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", {"new_version": version})

    def reload(self, weights_path: str | Path) -> None:
        """Every worker reloads its weights from the safetensors in `weights_path`, in place."""
        answer = self._call(
            "POST",
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(weights_path)}},
        )
        results = answer.get("results") if isinstance(answer, dict) else None
        # no result at all: no worker reloaded anything
        if not isinstance(results, list) or not results or any(r is not None for r in results):
            raise WeightSyncError(f"reload_weights answered {answer!r}, expected null per worker")

    def update(
        self, weights_path: str | Path, version: str, *, pause: PauseMode | None = "wait"
    ) -> WeightUpdate:
        """Reload `weights_path` and label it `version` (see the module docstring); `pause=None`
        skips the pause (only when nothing is in flight)."""
        path = Path(weights_path).resolve()
        started = time.perf_counter()
        previous = self.version()  # also the cheap check that the routes exist
        paused_at = time.time()
        try:
            if pause is not None:
                # inside the try: a pause that timed out here may still take effect there
                self.pause(pause)
            drained_at = time.time()
            self.reload(path)
            self.set_version(version)
        except BaseException as exc:
            if pause is not None:  # never leave the engine paused: every rollout would hang
                try:
                    self.resume()
                except WeightSyncError as again:  # keep the first error, say the server's state
                    exc.add_note(
                        f"resuming failed too ({again}): the server may still be paused; "
                        f"POST {self.root}/resume"
                    )
            raise
        if pause is not None:
            self.resume()
        resumed_at = time.time()
        reported = self.version()
        if reported != version:
            raise WeightSyncError(
                f"the server reports weight version {reported!r}, not {version!r}"
            )
        return WeightUpdate(
            version=reported,
            previous=previous,
            weights_path=path,
            save_s=0.0,
            reload_s=time.perf_counter() - started,
            pause=pause,
            paused_at=paused_at,
            drained_at=drained_at,
            resumed_at=resumed_at,
        )


def save_weights(model: Any, out_dir: str | Path, *, dtype: str = "bfloat16") -> Path:
    """Write `model`'s weights (a torch module or a name -> tensor mapping) as one safetensors
    file in `out_dir`, in `dtype` (what the server computes in), and return the folder.

    Tensors sharing storage (tied embeddings: SmolLM2's `lm_head`) are written once, under their
    first name; vLLM ties them again when it loads. `out_dir` must be new, empty or written by
    this function before: a folder of someone else's (the served model's own) is refused.
    """
    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()) and not (out / MARKER_FILE).is_file():
        raise ValueError(f"{out} holds files this function did not write: give a folder of its own")
    state = model.state_dict() if hasattr(model, "state_dict") else dict(model)
    target = getattr(torch, dtype)
    seen: set[tuple[int, tuple[int, ...]]] = set()
    tensors: dict[str, Any] = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))  # same memory, same shape: a tied copy
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = tensor.detach().to(device="cpu", dtype=target).contiguous()
    (out / MARKER_FILE).write_text("weights written by tito_agents.rl.weights.save_weights\n")
    partial = out / f".{WEIGHTS_FILE}.partial"
    save_file(tensors, str(partial), metadata={"format": "pt"})
    os.replace(partial, out / WEIGHTS_FILE)
    return out


def push_weights(
    model: Any,
    base_url: str,
    weights_dir: str | Path,
    version: str | int,
    *,
    dtype: str = "bfloat16",
    pause: PauseMode | None = "wait",
    timeout: float = DEFAULT_TIMEOUT,
) -> WeightUpdate:
    """After an optimizer step: save `model` into `weights_dir` and have the vLLM at `base_url`
    serve it in place under `version`. Returns the `WeightUpdate` (versions, seconds).

    Raises `WeightRoutesMissing` (before writing anything) when the server is not in dev mode:
    restart it on a saved folder instead (the message says how)."""
    server = VllmWeights(base_url, timeout=timeout)
    server.version()  # fail before the save when the routes are missing
    started = time.perf_counter()
    path = save_weights(model, weights_dir, dtype=dtype)
    saved = time.perf_counter() - started
    update = server.update(path, str(version), pause=pause)
    return dataclasses.replace(update, save_s=saved)

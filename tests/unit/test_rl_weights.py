"""`tito_agents.rl.weights`: what goes on the wire for an in-place update, the safetensors it
writes, and the error (with the restart fallback) from a server without the dev-mode routes.

The routes are played by `tests/support/vllm_dev_routes.DevRoutes`; the real reload is checked
end to end in tests/e2e/test_rl_weights_real.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.vllm_dev_routes import DevRoutes
from tito_agents.rl import (
    VllmWeights,
    WeightRoutesMissing,
    WeightSyncError,
    push_weights,
    save_weights,
)
from tito_agents.testing.fake_vllm import FakeConfig, FakeVLLMServer

torch = pytest.importorskip("torch", reason="saving weights needs torch")


@pytest.fixture
def dev() -> Iterator[DevRoutes]:
    with DevRoutes() as routes:
        yield routes


def tied_model() -> Any:
    """A module whose head shares the embedding's storage, as SmolLM2's does."""
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(8, 4)
    model.head = torch.nn.Linear(4, 8, bias=False)
    model.head.weight = model.embed.weight
    model.norm = torch.nn.LayerNorm(4)
    return model


def test_push_saves_pauses_reloads_labels_and_resumes(dev: DevRoutes, tmp_path: Path) -> None:
    model = tied_model()
    update = push_weights(model, dev.url, tmp_path / "w", version=3)

    assert (update.version, update.previous) == ("3", "default")
    assert update.weights_path == (tmp_path / "w").resolve()
    assert update.save_s > 0 and update.reload_s > 0
    assert update.seconds == pytest.approx(update.save_s + update.reload_s)
    posts = [(path, body) for method, path, body in dev.requests if method == "POST"]
    assert posts == [
        ("/pause?mode=wait", None),
        (
            "/collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(update.weights_path)}},
        ),
        ("/update_weight_version", {"new_version": "3"}),
        ("/resume", None),
    ]
    assert not dev.paused and VllmWeights(dev.url).version() == "3"


def test_saved_weights_are_bf16_with_tied_tensors_once(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = tied_model()
    out = save_weights(model, tmp_path / "w")
    loaded = load_file(str(out / "model.safetensors"))
    assert sorted(loaded) == ["embed.weight", "norm.bias", "norm.weight"]
    assert all(t.dtype == torch.bfloat16 for t in loaded.values())
    assert torch.equal(loaded["embed.weight"], model.embed.weight.detach().to(torch.bfloat16))
    save_weights(model, out)  # its own folder: overwritten
    foreign = tmp_path / "model"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="did not write"):
        save_weights(model, foreign)


def test_a_failed_reload_still_resumes_and_says_why(dev: DevRoutes, tmp_path: Path) -> None:
    dev.rpc_status, dev.rpc_answer = 500, {"error": "shape mismatch"}
    with pytest.raises(WeightSyncError, match="shape mismatch"):
        push_weights(tied_model(), dev.url, tmp_path / "w", version="v1")
    assert not dev.paused and dev.version == "default"
    dev.rpc_status, dev.rpc_answer = 200, {"results": ["oops"]}
    with pytest.raises(WeightSyncError, match="expected null per worker"):
        VllmWeights(dev.url).update(tmp_path / "w", "v1", pause=None)


def test_server_without_dev_mode_names_the_fix_and_the_fallback(tmp_path: Path) -> None:
    """A vLLM started without VLLM_SERVER_DEV_MODE=1 has no such routes: refused before any
    write, with how to turn them on and how to restart instead."""
    with FakeVLLMServer(FakeConfig()) as server, pytest.raises(WeightRoutesMissing) as caught:
        push_weights(tied_model(), server.base_url, tmp_path / "w", version=1)
    message = str(caught.value)
    assert "VLLM_SERVER_DEV_MODE=1" in message and "TITO_VLLM_MODEL_DIR" in message
    assert not (tmp_path / "w").exists()


def test_unreachable_server_is_a_sync_error(tmp_path: Path) -> None:
    with pytest.raises(WeightSyncError, match=r"127\.0\.0\.1:9"):
        VllmWeights("http://127.0.0.1:9/v1", timeout=5).version()

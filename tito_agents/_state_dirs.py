"""Where tito-agents keeps state on disk: one root for all of it.

`state_root()` is ``$TITO_CACHE_DIR``, else ``~/.cache/tito-agents`` (the rule of
`scripts/vllm_server.py` too, whose vLLM install and model live there). Under it:
``spill/<destination>/`` (samples a buffered sink could not deliver yet; ``$TITO_SPILL_DIR`` moves
only these), ``gateway-<port>.journal`` and ``gateway-<port>.token`` (the gateway's restart journal
and control token). Nothing is created here: each user makes its folder when it first writes.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["gateway_journal_path", "gateway_token_path", "spill_root", "state_root"]


def state_root() -> Path:
    """The folder under which tito-agents keeps its state (read from the environment each call)."""
    configured = os.environ.get("TITO_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tito-agents"


def spill_root() -> Path:
    """The folder holding every spill folder: ``$TITO_SPILL_DIR``, else ``<state root>/spill``."""
    configured = os.environ.get("TITO_SPILL_DIR")
    return Path(configured).expanduser() if configured else state_root() / "spill"


def gateway_journal_path(port: int) -> Path:
    """The gateway's default restart journal: ``<state root>/gateway-<port>.journal``."""
    return state_root() / f"gateway-{port}.journal"


def gateway_token_path(port: int) -> Path:
    """The gateway's default control-token file: ``<state root>/gateway-<port>.token``."""
    return state_root() / f"gateway-{port}.token"

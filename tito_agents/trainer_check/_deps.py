"""The one guarded import of torch and transformers for the trainer check.

The core install has no torch: everything in `tito_agents.trainer_check` that needs it imports it
through here, on first use, and a missing install raises `ConfigurationError` naming the extra.
"""

from __future__ import annotations

from types import ModuleType

from tito_agents.errors import ConfigurationError

INSTALL_HINT = "pip install torch transformers (or in a checkout: pip install '.[trainer-check]')"


def torch() -> ModuleType:
    """The `torch` module, or `ConfigurationError` with the install hint."""
    try:
        import torch as module
    except ImportError:  # pragma: no cover - installed in the dev environment
        raise ConfigurationError(f"the trainer check needs torch: {INSTALL_HINT}") from None
    return module


def transformers() -> ModuleType:
    """The `transformers` module, or `ConfigurationError` with the install hint."""
    try:
        import transformers as module
    except ImportError:  # pragma: no cover - installed in the dev environment
        raise ConfigurationError(f"the trainer check needs transformers: {INSTALL_HINT}") from None
    return module

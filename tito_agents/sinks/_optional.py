"""Install hints for the optional libraries of the sinks (pyarrow, redis, ray).

The core install stays light: each optional library is imported at the top of the one module that
needs it (columnar, redis_streams, ray_queue), inside a guard that raises `ConfigurationError` with
the command that installs it. Those modules are imported only when such a sink is built.
"""

from __future__ import annotations

from tito_agents.errors import ConfigurationError

# tito-agents is on no package index: its extras install from a checkout (`pip install '.[x]'`)
# or from the wheels of `make wheels` (`pip install --find-links dist 'tito-agents[x]'`).
_HINTS = {
    "pyarrow": "pip install pyarrow  (or, in a tito-agents checkout: pip install '.[arrow]')",
    "redis": "pip install redis  (or, in a tito-agents checkout: pip install '.[redis]')",
    "ray": "pip install 'ray>=2.40'  (or, in a tito-agents checkout: pip install '.[ray]')",
}


def missing(library: str) -> ConfigurationError:
    """The error raised when `library` is needed and absent; says how to install it."""
    hint = _HINTS.get(library, f"pip install {library}")
    return ConfigurationError(f"this sink needs {library!r}, which is not installed: {hint}")

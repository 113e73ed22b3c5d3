"""Install hints for the optional libraries of the sinks (pyarrow, redis, ray).

The core install stays light: each optional library is imported at the top of the one module that
needs it (columnar, redis_streams, ray_queue), inside a guard that raises `ConfigurationError` with
the command that installs it. Those modules are imported only when such a sink is built.
"""

from __future__ import annotations

from tito_agents.errors import ConfigurationError

_HINTS = {
    "pyarrow": "pip install 'tito-agents[arrow]'  (or: pip install pyarrow)",
    "redis": "pip install 'tito-agents[redis]'  (or: pip install redis)",
    "ray": "pip install 'tito-agents[ray]'  (or: pip install 'ray>=2.40')",
}


def missing(library: str) -> ConfigurationError:
    """The error raised when `library` is needed and absent; says how to install it."""
    hint = _HINTS.get(library, f"pip install {library}")
    return ConfigurationError(f"this sink needs {library!r}, which is not installed: {hint}")

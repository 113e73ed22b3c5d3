"""The Redis client both ends use (sink and reader): connection options, TLS, and redis-py
errors translated into `SinkError`s that say whether retrying can help."""

from __future__ import annotations

import re
from typing import Any

from tito_agents.errors import ConfigurationError, SinkError
from tito_agents.sinks._optional import missing

try:
    import redis
    import redis.exceptions as redis_errors
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without redis
    raise missing("redis") from exc


DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_STREAM = "tito:samples"
_SID = b"sid"
_TRANSIENT_REPLIES = ("OOM", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "BUSY")
"""Error codes of replies that a later try may not get (a failover, a full Redis, a script or a
load under way). redis-py turns most into their own classes and drops the code from the message
(`_TRANSIENT_ERRORS`); the rest (BUSY) stay a `ResponseError` whose message starts with the code,
behind ``Command # n (...) of pipeline caused error:`` when it came from a pipeline."""
_TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis_errors.OutOfMemoryError,  # OOM: readers free memory as they acknowledge
    redis_errors.ReadOnlyError,  # READONLY: a replica, until the failover promotes it
    redis_errors.TryAgainError,  # TRYAGAIN: a cluster slot is being moved
    redis_errors.ClusterDownError,  # CLUSTERDOWN, and MASTERDOWN (a subclass)
    redis_errors.BusyLoadingError,  # LOADING (also a ConnectionError)
)
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*?\) of pipeline caused error: ", re.DOTALL)


def connect(
    url: str = DEFAULT_URL,
    *,
    username: str | None = None,
    password: str | None = None,
    ssl_ca_certs: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    ssl_cert_reqs: str = "required",
    ssl_check_hostname: bool = True,
    socket_timeout: float | None = 10.0,
    connect_timeout: float | None = 5.0,
) -> redis.Redis:
    """A redis-py client for `url` (``redis://``, ``rediss://`` = TLS, ``unix://``).

    redis-py retries a failed command once, quickly; longer outages surface as retryable
    `SinkError`s, so the caller's own backoff (`BufferedSink`) decides how long to wait.
    """
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.02), 1),
    }
    if username is not None:
        kwargs["username"] = username
    if password is not None:
        kwargs["password"] = password
    if url.startswith("rediss://"):
        kwargs.update(
            ssl_ca_certs=ssl_ca_certs,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            ssl_cert_reqs=ssl_cert_reqs,
            ssl_check_hostname=ssl_check_hostname,
        )
    elif any(v is not None for v in (ssl_ca_certs, ssl_certfile, ssl_keyfile)):
        raise ConfigurationError("TLS options need a rediss:// URL")
    return redis.Redis.from_url(url, **kwargs)


def translate(exc: Exception, what: str) -> SinkError:
    """A redis-py error as a `SinkError` that knows whether retrying can help."""
    if isinstance(exc, redis_errors.AuthenticationError | redis_errors.AuthorizationError):
        return SinkError(f"{what}: Redis refused the credentials: {exc}", retryable=False)
    if isinstance(exc, redis_errors.NoPermissionError):
        return SinkError(f"{what}: the Redis user lacks a permission: {exc}", retryable=False)
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
        return SinkError(f"{what}: Redis unreachable: {exc}", retryable=True)
    if isinstance(exc, redis_errors.ResponseError):
        return SinkError(f"{what}: Redis error: {exc}", retryable=transient(exc))
    return SinkError(f"{what}: {type(exc).__name__}: {exc}", retryable=False)


def transient(exc: redis_errors.ResponseError) -> bool:
    """Whether Redis refused `exc`'s command for now only (see `_TRANSIENT_REPLIES`), whether it
    came from a plain call or from a pipeline (with or without MULTI)."""
    if isinstance(exc, _TRANSIENT_ERRORS):
        return True
    message = _PIPELINE_PREFIX.sub("", str(exc), count=1)
    return message.upper().startswith(_TRANSIENT_REPLIES)

"""`open_sink(spec)`: pick a sink with one argument (a path or a URL), options in the query string.

    open_sink("out/samples.jsonl")                       # JSON Lines, one file (the default sink)
    open_sink("out/samples.parquet")                     # rotating Parquet parts (zstd)
    open_sink("out/samples.arrow?max_file_samples=10000")
    open_sink("redis://:secret@10.0.0.5:6379/0?stream=rollouts&max_backlog=50000")
    open_sink("rediss://user:pw@redis.internal:6380/0")  # TLS; ssl_ca_certs=... as keyword
    open_sink("ray://tito-samples?namespace=rl")         # a named Ray queue actor (the name is
                                                         # not a Ray Client address: use address=)
    open_sink("asyncio://?maxsize=1024")                 # in-process asyncio queue
    open_sink("memory://")
    open_sink("out/samples.jsonl", partition_by="policy")  # out/samples.<policy>.jsonl
    open_sink("redis://host/0?stream=samples:{policy}&partition_by=policy")

Network sinks (Redis, Ray) come wrapped in a `BufferedSink` (buffer, retry with backoff, spill to
`$TITO_CACHE_DIR/spill/<destination>`, default `~/.cache/tito-agents/spill/…`, or
`$TITO_SPILL_DIR/<destination>`) unless `buffered=False`; file
and in-process sinks are not, unless `buffered=True`. Keyword options override the query string.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tito_agents._state_dirs import spill_root
from tito_agents.errors import ConfigurationError
from tito_agents.sinks.base import MemorySink, Sink
from tito_agents.sinks.buffered import BufferedSink
from tito_agents.sinks.jsonl import JsonlSink
from tito_agents.sinks.partition import DEFAULT_PARTITION, PartitionedSink, partition_spec

_Parser = Callable[[str], Any]


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _optional_int(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none") else int(text)


def _optional_float(text: str) -> float | None:
    return None if text.strip().lower() in ("", "none") else float(text)


def _optional_str(text: str) -> str | None:
    return None if text.strip().lower() in ("", "none") else text


_BUFFER_OPTIONS: dict[str, _Parser] = {
    "max_buffer_samples": int,
    "max_buffer_bytes": int,
    "linger": float,
    "spill_after": float,
    "close_timeout": float,
    "block_timeout": _optional_float,
}
_FILE_OPTIONS: dict[str, _Parser] = {
    "format": str,
    "max_file_samples": _optional_int,
    "max_file_bytes": _optional_int,
    "max_file_seconds": _optional_float,
    "compression": _optional_str,
    "row_group_size": int,
    "fsync": _bool,
    "recover": _bool,
}
_REDIS_OPTIONS: dict[str, _Parser] = {
    "stream": str,
    "maxlen": _optional_int,
    "approximate": _bool,
    "max_backlog": _optional_int,
    "backlog_timeout": float,
    "batch_size": int,
    "transaction": _bool,
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": _bool,
    "socket_timeout": _optional_float,
    "connect_timeout": _optional_float,
}
_RAY_OPTIONS: dict[str, _Parser] = {
    "namespace": str,
    "address": str,
    "capacity": int,
    "batch_size": int,
    "batch_bytes": int,
    "max_inflight": int,
    "lease_timeout": float,
    "recover_timeout": float,
    "adopt": str,
}
_QUEUE_OPTIONS: dict[str, _Parser] = {"maxsize": int, "max_bytes": _optional_int}
_ROTATION = ("max_file_samples", "max_file_bytes", "max_file_seconds", "format", "compression")


def open_sink(
    spec: str | os.PathLike[str] | Sink,
    *,
    buffered: bool | None = None,
    spill_dir: str | os.PathLike[str] | None = "default",
    partition_by: str | Callable[[Any], str | None] | None = None,
    **options: Any,
) -> Sink:
    """The sink `spec` names (see the module docstring); `ConfigurationError` for a bad spec.

    buffered: wrap in a `BufferedSink` (default: for Redis and Ray only).
    spill_dir: where a buffered sink spills; "default" = ``$TITO_SPILL_DIR/<destination>`` or
        ``$TITO_CACHE_DIR/spill/<destination>`` (default ``~/.cache/tito-agents/spill/…``),
        created only when something is spilled; None = no spill (backpressure instead).
    options: sink options (also accepted in the query string) and buffer options
        (`max_buffer_samples`, `max_buffer_bytes`, `linger`, `spill_after`, `close_timeout`,
        `block_timeout`).
    partition_by: "policy" (or "agent", or a function of a sample): a `PartitionedSink` opening
        this sink once per partition, on first use (`tito_agents.sinks.partition`: a file or
        stream per policy); also accepted in the query string (`?partition_by=policy`).
    """
    if not isinstance(spec, Sink) and "partition_by=" in str(spec):
        spec, partition_by = _without_partition(str(spec), partition_by)
    if partition_by is not None:
        if isinstance(spec, Sink):
            raise ConfigurationError("partition_by needs a path or URL (one sink per partition)")
        return _partitioned(str(spec), partition_by, buffered, spill_dir, options)
    if isinstance(spec, Sink):
        inner, network, key = spec, False, type(spec).__name__
        buffer_options = {k: options.pop(k) for k in list(options) if k in _BUFFER_OPTIONS}
        if options:
            raise ConfigurationError(f"options {sorted(options)} do not apply to a Sink object")
    else:
        inner, network, key, buffer_options = _build(str(spec), options)
    if not (network if buffered is None else buffered):
        if buffer_options:
            raise ConfigurationError(f"{sorted(buffer_options)} need buffered=True")
        return inner
    folder = default_spill_dir(key) if spill_dir == "default" else spill_dir
    return BufferedSink(inner, spill_dir=folder, name=key, **buffer_options)


def default_spill_dir(destination: str) -> Path:
    """``<spill root>/<destination>``: ``$TITO_SPILL_DIR``, else ``<state root>/spill``, the state
    root being ``$TITO_CACHE_DIR`` (default ``~/.cache/tito-agents``, see `tito_agents._state_dirs`);
    the name is made filesystem-safe. Not created here: the spill log makes it on first spill."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", destination).strip("_") or "sink"
    if len(safe) > 120:  # a long destination keeps a folder of its own
        safe = f"{safe[:100]}-{hashlib.sha256(destination.encode()).hexdigest()[:12]}"
    return spill_root() / safe


def _take(
    query: dict[str, str], options: dict[str, Any], table: dict[str, _Parser], what: str
) -> dict[str, Any]:
    """Typed sink options from the query string, then keyword options on top."""
    out: dict[str, Any] = {}
    for name, text in query.items():
        if name not in table:
            raise ConfigurationError(
                f"unknown option {name!r} for a {what} sink; known: {sorted(table)}"
            )
        try:
            out[name] = table[name](text)
        except ValueError as exc:
            raise ConfigurationError(f"option {name}={text!r}: {exc}") from exc
    for name in list(options):
        if name in table:
            out[name] = options.pop(name)
    return out


def _split(spec: str) -> tuple[Any, dict[str, str]]:
    parts = urlsplit(spec)
    return parts, dict(parse_qsl(parts.query, keep_blank_values=True))


def _build(spec: str, options: dict[str, Any]) -> tuple[Sink, bool, str, dict[str, Any]]:
    """(sink, is_network, destination key, buffer options)."""
    parts, query = _split(spec)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""  # "C:" is not a scheme
    buffer_query = {k: query.pop(k) for k in list(query) if k in _BUFFER_OPTIONS}
    buffer_options = _take(buffer_query, options, _BUFFER_OPTIONS, "buffered")
    if scheme in ("redis", "rediss"):
        from tito_agents.sinks.redis_streams import DEFAULT_STREAM, RedisStreamSink

        ours = {k: query.pop(k) for k in list(query) if k in _REDIS_OPTIONS}
        kwargs = _take(ours, options, _REDIS_OPTIONS, "Redis")
        kwargs.update(_pop_passthrough(options, ("username", "password", "client")))
        _refuse_leftovers(options, "Redis")
        url = urlunsplit(parts._replace(query=urlencode(query)))
        stream = kwargs.get("stream", DEFAULT_STREAM)
        key = f"redis-{parts.hostname}-{parts.port or 6379}{parts.path}-{stream}"
        return RedisStreamSink(url, **kwargs), True, key, buffer_options
    if scheme == "ray":
        from tito_agents.sinks.ray_queue import DEFAULT_NAME, RaySink

        kwargs = _take(query, options, _RAY_OPTIONS, "Ray")
        kwargs.update(options.pop("init_options", None) or {})  # for ray.init, if not connected
        _refuse_leftovers(options, "Ray")
        name = (parts.netloc + parts.path).strip("/") or DEFAULT_NAME
        return RaySink(name, **kwargs), True, f"ray-{name}", buffer_options
    if scheme in ("asyncio", "queue"):
        from tito_agents.sinks.queue import AsyncQueueSink

        kwargs = _take(query, options, _QUEUE_OPTIONS, "asyncio queue")
        kwargs.update(_pop_passthrough(options, ("spill_dir", "loop")))
        _refuse_leftovers(options, "asyncio queue")
        return AsyncQueueSink(**kwargs), False, "asyncio", buffer_options
    if scheme == "memory":
        _refuse_leftovers({**query, **options}, "memory")
        return MemorySink(), False, "memory", buffer_options
    if scheme not in ("", "file"):
        raise ConfigurationError(
            f"unknown sink {spec!r}: use a .jsonl/.parquet/.arrow path, redis://, rediss://, "
            "ray://, asyncio:// or memory://"
        )
    path = parts.path if scheme == "file" else spec.split("?", 1)[0]
    if not path:
        raise ConfigurationError(f"no path in {spec!r}")
    kwargs = _take(query if "?" in spec else {}, options, _FILE_OPTIONS, "file")
    _refuse_leftovers(options, "file")
    from tito_agents.sinks.files import format_for

    key = f"file-{os.path.abspath(path)}"  # the spill folder of one file, wherever it is opened
    plain_jsonl = format_for(path) == "jsonl" and not any(k in kwargs for k in _ROTATION)
    if plain_jsonl and set(kwargs) <= {"fsync"}:
        return JsonlSink(path, **kwargs), False, key, buffer_options
    from tito_agents.sinks.files import RotatingFileSink

    return RotatingFileSink(path, **kwargs), False, key, buffer_options


def _pop_passthrough(options: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: options.pop(name) for name in names if name in options}


def _refuse_leftovers(options: dict[str, Any], what: str) -> None:
    if options:
        raise ConfigurationError(f"unknown option(s) {sorted(options)} for a {what} sink")


def _without_partition(spec: str, given: Any) -> tuple[str, Any]:
    """`spec` without its `partition_by` query option, and the option (a keyword one wins)."""
    head, _, query = spec.partition("?")
    pairs = parse_qsl(query, keep_blank_values=True)
    found = [value for key, value in pairs if key == "partition_by"]
    rest = urlencode([(key, value) for key, value in pairs if key != "partition_by"], safe="{}:")
    chosen = given if given is not None else (found[-1] if found else None)
    return (f"{head}?{rest}" if rest else head), chosen


def _partitioned(
    spec: str,
    key: str | Callable[[Any], str | None],
    buffered: bool | None,
    spill_dir: str | os.PathLike[str] | None,
    options: dict[str, Any],
) -> PartitionedSink:
    """A `PartitionedSink` whose partitions are `spec` renamed per partition (`partition_spec`).
    The spec and its options are checked now by opening nothing: a name is only known once a
    sample of it arrives."""
    parts, query = _split(spec)
    scheme = parts.scheme.lower() if len(parts.scheme) > 1 else ""
    _check_option_names(scheme, {**query, **options} if "?" in spec else options)
    if scheme in ("redis", "rediss"):
        from tito_agents.sinks.redis_streams import DEFAULT_STREAM

        stream = str(options.get("stream") or query.get("stream") or DEFAULT_STREAM)

        def open_partition(name: str) -> Sink:
            _, own = partition_spec(scheme, "", stream, name)
            return open_sink(
                spec, buffered=buffered, spill_dir=spill_dir, **{**options, "stream": own}
            )

        return PartitionedSink(open_partition, key)
    if scheme == "ray":
        from tito_agents.sinks.ray_queue import DEFAULT_NAME

        queue = (parts.netloc + parts.path).strip("/") or DEFAULT_NAME

        def open_ray(name: str) -> Sink:
            own, _ = partition_spec(scheme, queue, None, name)
            url = urlunsplit(parts._replace(netloc=own, path=""))
            return open_sink(url, buffered=buffered, spill_dir=spill_dir, **options)

        return PartitionedSink(open_ray, key)
    if scheme == "memory":
        return PartitionedSink(
            lambda name: open_sink(spec, buffered=buffered, spill_dir=spill_dir, **options), key
        )
    if scheme not in ("", "file"):
        partition_spec(scheme, "", None, DEFAULT_PARTITION)  # raises: not partitionable
    base, _, query_text = (parts.path, "", "") if scheme == "file" else spec.partition("?")

    def open_file(name: str) -> Sink:
        own, _ = partition_spec("", base, None, name)
        if scheme == "file":  # the query stays in the URL
            url = urlunsplit(parts._replace(path=own))
        else:
            url = f"{own}?{query_text}" if query_text else own
        return open_sink(url, buffered=buffered, spill_dir=spill_dir, **options)

    return PartitionedSink(open_file, key)


def _check_option_names(scheme: str, options: dict[str, Any]) -> None:
    """Refuse option names the sink of `scheme` does not know (before any partition exists)."""
    tables: dict[str, dict[str, Any]] = {
        "redis": {**_REDIS_OPTIONS, "username": 0, "password": 0, "client": 0},
        "rediss": {**_REDIS_OPTIONS, "username": 0, "password": 0, "client": 0},
        "ray": {**_RAY_OPTIONS, "init_options": 0},
        "memory": {},
        "": _FILE_OPTIONS,
        "file": _FILE_OPTIONS,
    }
    known = tables.get(scheme)
    if known is None:
        return  # refused with its own message
    unknown = sorted(k for k in options if k not in known and k not in _BUFFER_OPTIONS)
    if unknown:
        raise ConfigurationError(f"unknown option(s) {unknown} for a partitioned sink")

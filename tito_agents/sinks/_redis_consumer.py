"""Stable consumer names for `RedisStreamReader`, with a lease that keeps two live readers apart.

Redis keeps a consumer group's unacknowledged entries per consumer *name*. A trainer that restarts
under the name it had gets those entries back at once; under a new name (a host-pid one, say)
they wait until another reader claims them after `claim_idle`. So the default name must survive
a restart, yet two readers alive at the same time must never share one: both would be handed
each other's pending entries and train on them twice.

The name is, in order: the `consumer` given; ``<group>-<worker>`` for a `worker` given; from the
environment of a distributed launcher, ``<group>-rank<RANK>`` (torchrun, unique across hosts) or
``<group>-<host>-local<LOCAL_RANK>``; else ``<group>-<host>`` on the first free slot
(``<group>-<host>-1``, ``-2``, … when readers already hold the ones before).

A derived name is held through a lease key in Redis naming its holder (host identity, pid, process
start time). A reader on the same host may take a name over only once that process is gone, which
it checks directly (a SIGKILLed trainer's name is free at once; no timeout to wait out). A name
held by a live reader is refused: for the host name, the next slot is tried; for a worker or rank
name it is a `ConfigurationError` (two readers claim the same rank, e.g. DataLoader workers that
inherited ``RANK``). Holders on other hosts cannot be checked: a host-name slot they hold is
skipped until its lease lapses; a rank or worker name is unique by the caller's word, so it is
taken over (a rank restarted on another machine keeps its pending entries). A `consumer` given
explicitly is used as is, with no lease.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tito_agents.errors import ConfigurationError

try:
    import redis
    import redis.exceptions as redis_errors
except ImportError as exc:  # pragma: no cover - exercised only without redis
    from tito_agents.sinks._optional import missing

    raise missing("redis") from exc

LEASE_TTL = 24 * 3600
"""Seconds a lease lives without renewal (a reader renews it every `LEASE_TTL / 4` while it reads).
Only holders on other hosts depend on it: same-host holders are checked by pid."""
MAX_SLOTS = 256


def host_identity() -> str:
    """This host as a process sees it: hostname, boot id and pid namespace. Two containers that
    share a hostname and a kernel still differ by pid namespace, so a pid is only ever looked up
    where it means the same process."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "|".join(parts)


def _start_time(pid: int) -> str:
    """The process start time (clock ticks since boot, Linux), so that a reused pid is not taken
    for the holder; "" where /proc is absent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rindex(")") + 2 :].split()
    return "Z" if fields[0] in ("Z", "X") else fields[19]


def process_alive(pid: int, start_time: str) -> bool:
    """Whether `pid` on this host is the live process that took the lease (a zombie is dead: a
    killed trainer whose parent has not reaped it yet must not keep its name)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = _start_time(pid)
    if now == "Z":
        return False
    return not (start_time and now and now != start_time)


def _watch(pipe: Any, key: str) -> None:
    """WATCH `key` on `pipe` (redis-py leaves `watch` untyped)."""
    watch: Callable[[str], object] = pipe.watch
    watch(key)


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    start_time: str
    token: str

    def encode(self) -> bytes:
        return "\t".join((self.host, str(self.pid), self.start_time, self.token)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Holder | None:
        try:
            host, pid, start_time, token = raw.decode().split("\t")
            return cls(host, int(pid), start_time, token)
        except ValueError:
            return None

    @classmethod
    def me(cls) -> Holder:
        pid = os.getpid()
        return cls(host_identity(), pid, _start_time(pid), secrets.token_hex(8))


def derived_name(group: str, worker: str | int | None) -> tuple[str, bool]:
    """The name for `worker` (or from the launcher's environment) and whether it is per host
    (then slots apply). See the module docstring."""
    if worker is not None:
        return f"{group}-{worker}", False
    rank = os.environ.get("RANK")
    if rank:
        return f"{group}-rank{rank}", False
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank:
        return f"{group}-{socket.gethostname()}-local{local_rank}", False
    return f"{group}-{socket.gethostname()}", True


class ConsumerLease:
    """Holds one consumer name of `group` on `stream` for this reader (see the module docstring)."""

    def __init__(self, client: redis.Redis, stream: str, group: str, base: str, per_host: bool):
        self.client = client
        self.prefix = f"{stream}:consumer:{group}:"
        self.base = base
        self.per_host = per_host
        self.me = Holder.me()
        self.name: str | None = None

    def acquire(self) -> str:
        """Take the base name (or, per host, the first free slot); raises `ConfigurationError`
        when a live reader holds the name, `redis` errors when Redis is unreachable."""
        if self.name is not None:
            return self.name
        self.me = Holder.me()  # here, not at creation: a reader may be made before a fork
        slots = range(MAX_SLOTS) if self.per_host else range(1)
        for slot in slots:
            name = self.base if slot == 0 else f"{self.base}-{slot}"
            holder = self._take(name)
            if holder is None:
                self.name = name
                return name
            if not self.per_host:
                raise ConfigurationError(
                    f"consumer name {name!r} is held by a live reader (pid {holder.pid} on this "
                    "host): give each reader of a group its own worker= or consumer="
                )
        raise ConfigurationError(
            f"{MAX_SLOTS} readers of this group already run on this host: pass worker= or consumer="
        )

    def _take(self, name: str) -> Holder | None:
        """None once the name is ours; else the live holder that keeps it."""
        key = self.prefix + name
        mine = self.me.encode()
        for _ in range(8):
            if self.client.set(key, mine, nx=True, ex=LEASE_TTL):
                return None
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    _watch(pipe, key)
                    raw: Any = pipe.get(key)
                    if raw is None:
                        continue  # lapsed meanwhile: try SET NX again
                    holder = Holder.decode(bytes(raw))
                    if holder is not None and holder.token != self.me.token and self._alive(holder):
                        return holder
                    pipe.multi()
                    pipe.set(key, mine, ex=LEASE_TTL)
                    pipe.execute()
                    return None
                except redis_errors.WatchError:
                    continue  # another reader changed it: look again
        raise ConfigurationError(f"could not settle the lease on consumer name {name!r}")

    def _alive(self, holder: Holder) -> bool:
        if holder.host == self.me.host:
            return process_alive(holder.pid, holder.start_time)
        # another host: unknowable here. A host slot is kept until its lease lapses; a rank or
        # worker name is unique by contract, so its holder is a previous life of this reader.
        return self.per_host

    def renew(self) -> None:
        if self.name is not None:
            self.client.set(self.prefix + self.name, self.me.encode(), ex=LEASE_TTL)

    def release(self) -> None:
        """Free the name if it is still ours (so that a reader started next on this host takes it
        rather than a new slot)."""
        if self.name is None:
            return
        key = self.prefix + self.name
        with self.client.pipeline(transaction=True) as pipe:
            try:
                _watch(pipe, key)
                if pipe.get(key) == self.me.encode():
                    pipe.multi()
                    pipe.delete(key)
                    pipe.execute()
            except redis_errors.WatchError:
                pass
        self.name = None

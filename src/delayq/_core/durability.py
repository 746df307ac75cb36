"""Durable offers: ``WAIT`` / ``WAITAOF`` after a write, on the connection that made it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from ..exceptions import ConfigError
from .timing import Duration, setting_s

Shortfall = Literal["raise", "warn"]

# The durable-write mark (see Durability.mark) lives this long after the last such write.
MARK_TTL_MS = 10_000


@dataclass(frozen=True, slots=True)
class Durability:
    """How many copies of a write must exist before an offer, a cancel or a reschedule
    returns.

    After each offer (single and bulk), each cancel, each reschedule that moved a task (and
    each ack with ``after_ack=True``) the queue sends ``WAIT replicas timeout`` on the
    connection that made the write, or, with ``aof=True``, ``WAITAOF 1 replicas timeout``
    (Redis 7.2+ and Valkey 8: the master's and the replicas' append-only files fsynced). When
    fewer copies confirm within ``timeout`` (seconds or a timedelta, at most 60 s), the call
    raises :class:`~delayq.NotDurable` (``on_shortfall="raise"``) or logs a warning
    (``"warn"``). The write itself stands either way: offering the same id again is safe; a
    cancel that raised did cancel on the master, and a failover may undo it (``get()`` tells).

    With ``after_fetch=True`` each fetch that leases tasks waits too, before it hands them
    out: a lease only the master has is lost in a failover, and the promoted replica hands
    the task to a second consumer while the first still runs it. On a shortfall the fetched
    tasks are handed back (unstarted, no attempt counted) and the fetch raises
    :class:`~delayq.NotDurable` (``"raise"``; a worker backs off and fetches again), or they
    are handed out with a warning (``"warn"``). It costs a replica's round trip per fetch.

    This covers a master that crashes after answering: a confirmed task is on a replica (or
    on disk) that a failover promotes. It does not cover a network partition in which an
    isolated master keeps taking writes (split brain): those can still be lost when it
    rejoins. Redis's ``min-replicas-to-write`` narrows that window.
    """

    replicas: int = 1
    aof: bool = False
    timeout: Duration = 1.0  # seconds or a timedelta; read back as seconds
    on_shortfall: Shortfall = "raise"
    after_ack: bool = False
    after_fetch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or isinstance(self.replicas, bool):
            raise ConfigError(f"replicas must be an int, got {self.replicas!r}")
        if not 0 <= self.replicas <= 100:
            raise ConfigError(f"replicas must be from 0 to 100, got {self.replicas}")
        if self.replicas == 0 and not self.aof:
            raise ConfigError("a Durability with replicas=0 and aof=False waits for nothing")
        if not all(isinstance(v, bool) for v in (self.aof, self.after_ack, self.after_fetch)):
            raise ConfigError("aof, after_ack and after_fetch must be True or False")
        timeout = setting_s(self.timeout, "timeout", allow_zero=False)
        if timeout > 60:
            raise ConfigError(f"timeout must be from 0 to 60 seconds (not 0), got {self.timeout!r}")
        object.__setattr__(self, "timeout", timeout)  # seconds from here on, equal either way
        if self.on_shortfall not in ("raise", "warn"):
            raise ConfigError(f"on_shortfall must be 'raise' or 'warn', got {self.on_shortfall!r}")

    @property
    def timeout_s(self) -> float:
        """``timeout`` in seconds (it may have been given as a timedelta)."""
        timeout = self.timeout  # seconds once __post_init__ ran
        return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)

    @property
    def timeout_ms(self) -> int:
        return max(1, round(self.timeout_s * 1000))

    def commands(self) -> tuple[tuple[Any, ...], ...]:
        """The command that follows a write on its connection."""
        if self.aof:
            return (("WAITAOF", 1, self.replicas, self.timeout_ms),)
        return (("WAIT", self.replicas, self.timeout_ms),)

    @staticmethod
    def mark(key: str) -> tuple[Any, ...]:
        """A write of ``key`` (a short-lived key in the write's slot), sent before the wait
        when the call may have written nothing on its connection. ``WAIT`` and ``WAITAOF``
        cover the writes made on their own connection, and a call resent on a new connection
        after a lost reply (answered from its receipt), or an offer of an id that exists,
        writes none there: its wait alone would confirm nothing of the first write (Valkey 8
        answers it at once). After the mark the wait covers all that the master had taken."""
        return ("SET", key, "1", "PX", MARK_TTL_MS)

    def shortfall(self, replies: Sequence[Any]) -> str | None:
        """What the confirmations in ``replies`` (of :meth:`commands`) lack, or None."""
        reply = replies[-1]
        if self.aof:
            local, replicas = int(reply[0]), int(reply[1])
            missing = []
            if local < 1:
                missing.append("the master's append-only file was not fsynced")
            if replicas < self.replicas:
                missing.append(f"{replicas} of {self.replicas} replicas fsynced")
            return "; ".join(missing) or None
        confirmed = int(reply)
        if confirmed >= self.replicas:
            return None
        return f"{confirmed} of {self.replicas} replicas confirmed"

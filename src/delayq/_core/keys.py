"""Redis key names of a queue: the one place that spells them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..exceptions import ConfigError

# A sharded queue's sub-queues add "~<shard>.<salt>" to its name (see sharding.shard_names).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,199}(~[0-9]{1,4}\.[0-9]{1,9})?")
_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")

# Order matters: every Lua script unpacks KEYS in exactly this order (see lua/_lib.lua).
KEY_ROLES = (
    "delayed",  # ZSET id -> due ms*10 + slot: waiting tasks, due ones included
    "tasks",  # HASH id -> envelope
    "inflight",  # ZSET id -> lease expiry ms*10 + slot
    "leases",  # HASH id -> lease token of the current delivery
    "attempts",  # HASH id -> deliveries so far
    "dead",  # ZSET id -> time of death ms*10 + slot
    "errors",  # HASH id -> last error text
    "expiry",  # ZSET id -> ttl deadline ms
    "keys",  # HASH dedup key -> id
    "taskkeys",  # HASH id -> "key_ttl_ms|dedup key"
    "keptkeys",  # ZSET dedup key -> ms until which a finished task's key stays taken
    "counters",  # HASH counter name -> lifetime count
    "events",  # pub/sub channel: the earliest due ms, when it moves earlier (always last)
)


# The keys whose existence means a queue uses a pause, limits, task histories or schedules:
# the plain fetch and ack (lua/_plain.lua) refuse such a queue. Sent by the client after a
# call's receipt (KEYS[15..24]): naming them costs the client an argument each, where
# building them in Lua cost Redis a string concatenation each on every call.
FEATURE_ROLES = (
    "pause",
    "lim",
    "lim:ready",
    "lim:hold",
    "lim:gate",
    "lim:held",
    "lim:task",
    "hist",
    "sched:due",
    "sched:fire",
)


def validate_name(name: object) -> str:
    """Return ``name`` if it is a valid queue name, else raise :class:`ConfigError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"invalid queue name {name!r}: use 1-200 characters from A-Z a-z 0-9 _ . : -, "
            "starting with a letter or digit"
        )
    return name


def check_prefix(prefix: object) -> str:
    """Return ``prefix`` if it can start key names, else raise :class:`ConfigError`."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ConfigError(f"invalid key prefix {prefix!r}")
    return prefix


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The key names of one queue, all under the hash tag ``{name}`` (one cluster slot)."""

    prefix: str
    name: str
    # On a cluster the channel is a shard channel (SSUBSCRIBE/SPUBLISH, one node per wake-up
    # instead of every node); the scripts tell it by its role name, "sevents".
    sharded_channel: bool = False

    def __post_init__(self) -> None:
        validate_name(self.name)
        check_prefix(self.prefix)

    def key(self, role: str) -> str:
        """The full key name of ``role`` (one of :data:`KEY_ROLES`)."""
        if role == "events" and self.sharded_channel:
            role = "sevents"
        return f"{self.prefix}:{{{self.name}}}:{role}"

    @property
    def all(self) -> tuple[str, ...]:
        """Every key of the queue, in script order."""
        return tuple(self.key(role) for role in KEY_ROLES)

    @property
    def features(self) -> tuple[str, ...]:
        """The keys of :data:`FEATURE_ROLES`, in order: the plain scripts' KEYS[15..24]."""
        return tuple(self.key(role) for role in FEATURE_ROLES)

    def receipt(self, op: str, nonce: str) -> str:
        """The short-lived key in which one script call keeps its reply, so that the same
        call resent after a lost reply (by delayq or by the client's own retry) gets the same
        answer instead of acting twice."""
        return self.key(f"{op}:{nonce}")

    @property
    def offer_one(self) -> tuple[str, ...]:
        """The short key list of the single-offer script."""
        return (self.key("delayed"), self.key("tasks"), self.key("counters"), self.key("events"))

    @property
    def channel(self) -> str:
        """The pub/sub channel that announces a new earliest due time."""
        return self.key("events")

    # [S] recurring schedules (docs/storage.md): derived in the scripts from the prefix, so
    # under the same hash tag; not in KEY_ROLES.
    @property
    def schedules(self) -> str:
        """HASH schedule name -> version: the queue's live schedules."""
        return self.key("sched")

    @property
    def schedules_due(self) -> str:
        """ZSET schedule name -> the nominal ms of its next fire."""
        return self.key("sched:due")

    @property
    def schedule_fires(self) -> str:
        """HASH fire task id -> schedule name, for fires not yet ended."""
        return self.key("sched:fire")

    def schedule_state(self, name: str) -> str:
        """HASH one schedule's spec and state (a tombstone with a TTL once removed)."""
        return self.key(f"sched:st:{name}")

    def schedule_times(self, name: str) -> str:
        """ZSET one cron schedule's times ahead."""
        return self.key(f"sched:at:{name}")

    def schedule_buffer(self, name: str) -> str:
        """LIST one schedule's fires held back by the overlap policy."""
        return self.key(f"sched:buf:{name}")

    @property
    def registry(self) -> str:
        """The set of known queue names (outside the queue's slot: written by clients only)."""
        return f"{self.prefix}:queues"

    # -- [L] flow control (issue #20): keys the scripts derive from the prefix (lua/_lib.lua)

    @property
    def pause(self) -> str:
        """HASH until/since/note of a paused queue (absent: not paused)."""
        return self.key("pause")

    @property
    def limits(self) -> str:
        """HASH limit key -> encoded :class:`~delayq.Limit` (absent: no limits)."""
        return self.key("lim")

    def limit_state(self, part: str) -> str:
        """A limit state key: ``task``, ``tat``, ``run``, ``held``, ``gate``, ``full``,
        ``hold`` or ``w:<limit key>`` (the tasks parked for that key)."""
        return self.key(f"lim:{part}")

    # -- [H] task history (issue #22): keys the scripts derive from the prefix (lua/_lib.lua)

    @property
    def history_settings(self) -> str:
        """HASH ret/max/bytes of a queue that keeps task histories (absent: it keeps none)."""
        return self.key("hist")

    def history(self, task_id: str) -> str:
        """LIST one task's history, oldest event first."""
        return self.key(f"hist:{task_id}")

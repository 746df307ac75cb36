"""A queue's options, validated once: what ``AsyncDelayQueue(...)`` and the outbox's
``QueueFormat`` take, turned into the values the engine works with (milliseconds, the
script :class:`Policy`, the :class:`EnvelopeCodec`).

Every check raises :class:`ConfigError` naming the parameter, before anything connects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..exceptions import ConfigError
from . import sharding
from .codecs import PayloadType, check_codec
from .durability import Durability
from .envelope import EnvelopeCodec
from .history import HistoryOption, HistorySettings, history_option
from .keys import QueueKeys, check_prefix
from .models import Backoff, DedupMode
from .protocol import Policy
from .timing import Duration, duration_ms

MAX_FETCH_AHEAD = 100


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be True or False, got {value!r}")
    return value


def _ms(value: object, what: str, *, allow_zero: bool = True) -> int:
    # duration_ms raises InvalidDelay (an InvalidTaskError: a task's problem); here it is the
    # queue's configuration that is wrong.
    try:
        return duration_ms(value, what, allow_zero=allow_zero)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def check_int(value: object, what: str, low: int, high: int | None = None) -> int:
    """``value`` if it is an int (a bool is not) from ``low`` to ``high`` (None: no bound),
    else a :class:`ConfigError` naming ``what``: a bad count never reaches Redis."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bounds = f">= {low}" if high is None else f"from {low} to {high}"
        raise ConfigError(f"{what} must be an int {bounds}, got {value!r}")
    return value


def check_max_attempts(value: object) -> int:
    return check_int(value, "max_attempts", 1)


def check_backoff(value: object) -> Backoff:
    if not isinstance(value, Backoff):
        raise ConfigError(f"retry_backoff must be a Backoff, got {value!r}")
    return value


def lease_ms(visibility_timeout: object) -> int:
    """A visibility timeout (seconds or a timedelta, > 0) in milliseconds."""
    return _ms(visibility_timeout, "visibility_timeout", allow_zero=False)


def dedup_mode(value: object) -> DedupMode:
    """``"keep"`` or ``"replace"`` as a :class:`DedupMode`."""
    if not isinstance(value, str) or value not in ("keep", "replace"):
        raise ConfigError(f"dedup must be 'keep' or 'replace', got {value!r}")
    return DedupMode(value)


def envelope_codec(codec: str, payload_type: type | None, max_payload_bytes: int) -> EnvelopeCodec:
    """How a queue's tasks are encoded: the codec, the payload class and the size limit."""
    check_int(max_payload_bytes, "max_payload_bytes", 1)
    typed = PayloadType(payload_type) if payload_type is not None else None  # checks the class
    return EnvelopeCodec(check_codec(codec), typed, max_payload_bytes)


def overridden_policy(
    policy: Policy,
    queue: str,
    visibility_timeout: Duration | None = None,
    max_attempts: int | None = None,
    retry_backoff: Backoff | None = None,
) -> Policy:
    """``policy`` with the settings given (None: kept), for ``with_policy`` and workers."""
    if visibility_timeout is not None:
        if policy.lease_ms == 0:
            raise ConfigError(f"queue {queue!r} is at-most-once: it has no lease to time")
        policy = replace(policy, lease_ms=lease_ms(visibility_timeout))
    if max_attempts is not None:
        policy = replace(policy, max_attempts=check_max_attempts(max_attempts))
    if retry_backoff is not None:
        policy = replace(policy, backoff=check_backoff(retry_backoff))
    return policy


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """The validated options of a queue object (see :class:`AsyncDelayQueue` for each).

    :meth:`of` takes them as users give them, with the queue's defaults (a unit test holds
    the two signatures' defaults equal)."""

    codec: EnvelopeCodec
    policy: Policy  # lease_ms 0: at-most-once (ack=False)
    dedup: DedupMode
    safety_s: float
    reconnect_s: float | None  # None: the connection layer's default for the topology
    overdue_ms: int
    prefix: str
    durability: Durability | None
    fetch_ahead: int
    shards: int | None  # only to create a sharded queue
    create: bool
    history: HistoryOption = None  # [H] None: as Redis has it; False: turn it off

    @classmethod
    def of(
        cls,
        *,
        codec: str = "json",
        payload_type: type | None = None,
        visibility_timeout: Duration = 30.0,
        max_attempts: int = 10,
        retry_backoff: Backoff | None = None,
        ack: bool = True,
        dedup: str = "keep",
        safety_interval: Duration = 10.0,
        reconnect_timeout: Duration | None = None,
        max_payload_bytes: int = 1 << 20,
        overdue_after: Duration = 1.0,
        prefix: str = "dq",
        durability: Durability | None = None,
        fetch_ahead: int = 8,
        shards: int | None = None,
        create: bool = False,
        history: Duration | bool | HistorySettings | None = None,
    ) -> QueueOptions:
        """Check every option (:class:`ConfigError` naming the first bad one) and keep them
        in the engine's units."""
        attempts = check_max_attempts(max_attempts)
        coded = envelope_codec(codec, payload_type, max_payload_bytes)
        at_least_once = _flag(ack, "ack")
        check_int(fetch_ahead, "fetch_ahead", 0, MAX_FETCH_AHEAD)
        if durability is not None and not isinstance(durability, Durability):
            raise ConfigError(f"durability must be a Durability, got {durability!r}")
        # The lease is checked even at-most-once: a bad value is a mistake either way.
        lease = lease_ms(visibility_timeout)
        return cls(
            codec=coded,
            policy=Policy(
                lease if at_least_once else 0,
                attempts,
                Backoff() if retry_backoff is None else check_backoff(retry_backoff),
            ),
            dedup=dedup_mode(dedup),
            safety_s=_ms(safety_interval, "safety_interval", allow_zero=False) / 1000,
            reconnect_s=(
                None
                if reconnect_timeout is None
                else _ms(reconnect_timeout, "reconnect_timeout") / 1000
            ),
            overdue_ms=_ms(overdue_after, "overdue_after"),
            prefix=check_prefix(prefix),
            durability=durability,
            fetch_ahead=fetch_ahead,
            shards=None if shards is None else sharding.check_shards(shards),
            create=_flag(create, "create"),
            history=history_option(history),
        )

    def keys(self, name: str, *, sharded_channel: bool = False) -> QueueKeys:
        """The key names of queue ``name`` under these options (a :class:`ConfigError` for a
        name Redis keys cannot hold, or too long to be sharded when ``shards`` is set)."""
        keys = QueueKeys(self.prefix, name, sharded_channel=sharded_channel)
        if self.shards is not None:
            sharding.shard_names(name, self.shards)  # the name fits its shards' names
        return keys

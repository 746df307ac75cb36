"""The ``DELAYQ`` Django setting, read and checked in one place.

::

    DELAYQ = {
        "REDIS_URL": "redis://127.0.0.1:6379/0",  # default: $REDIS_URL, else that URL
        "PREFIX": "dq",                            # first part of every Redis key
        "DATABASE": "default",                     # the PostgreSQL alias holding the outbox
        "QUEUES": {
            "orders": {
                "HANDLER": "shop.tasks.close_order",           # for manage.py delayq_worker
                "OPTIONS": {"visibility_timeout": 60, "max_attempts": 5},  # DelayQueue options
            },
            "reminders": "shop.tasks.send_reminder",         # shorthand: just the handler
        },
        "WORKER": {"concurrency": 8, "timeout": None, "grace": 30},  # Worker options
    }

Durations (``timeout``, ``grace``, ``visibility_timeout``) are seconds or a ``timedelta``,
as everywhere in delayq.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from ..._core.timing import setting_s
from ...exceptions import ConfigError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
_TOP_KEYS = frozenset({"REDIS_URL", "PREFIX", "DATABASE", "QUEUES", "WORKER"})
_QUEUE_KEYS = frozenset({"HANDLER", "OPTIONS"})
# What Worker/AsyncWorker take as options, so a typo fails when the settings are read.
_WORKER_KEYS = frozenset(
    {"concurrency", "timeout", "grace", "prefetch", "health_file", "visibility_timeout",
     "max_attempts", "retry_backoff"}
)  # fmt: skip
# The worker options that are durations, each checked (and whether 0 is allowed) on reading.
_WORKER_DURATIONS = {"timeout": False, "grace": True, "visibility_timeout": False}


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """One entry of ``DELAYQ["QUEUES"]``."""

    name: str
    handler: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DelayqSettings:
    """The checked ``DELAYQ`` setting."""

    redis_url: str
    prefix: str
    database: str
    queues: dict[str, QueueSettings]
    worker: dict[str, Any]

    def queue(self, name: str) -> QueueSettings:
        """The settings of queue ``name``; a queue not listed gets the defaults."""
        return self.queues.get(name) or QueueSettings(name)


def delayq_settings() -> DelayqSettings:
    """Read and check ``settings.DELAYQ``; raise ``ImproperlyConfigured`` naming what is wrong."""
    raw = getattr(django_settings, "DELAYQ", {})
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"DELAYQ must be a dict, not {type(raw).__name__}")
    _no_unknown(raw, _TOP_KEYS, "DELAYQ")
    redis_url = raw.get("REDIS_URL") or os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    prefix = raw.get("PREFIX", "dq")
    database = raw.get("DATABASE", "default")
    for what, value in (("REDIS_URL", redis_url), ("PREFIX", prefix), ("DATABASE", database)):
        if not isinstance(value, str) or not value:
            raise ImproperlyConfigured(f"DELAYQ[{what!r}] must be a non-empty string: {value!r}")
    if database not in django_settings.DATABASES:
        raise ImproperlyConfigured(
            f"DELAYQ['DATABASE'] is {database!r}, which is not in DATABASES "
            f"({', '.join(sorted(django_settings.DATABASES))})"
        )
    worker = raw.get("WORKER", {})
    if not isinstance(worker, dict):
        raise ImproperlyConfigured("DELAYQ['WORKER'] must be a dict of Worker options")
    _no_unknown(worker, _WORKER_KEYS, "DELAYQ['WORKER']")
    for name, allow_zero in _WORKER_DURATIONS.items():
        if worker.get(name) is not None:
            try:
                setting_s(worker[name], name, allow_zero=allow_zero)
            except ConfigError as exc:
                raise ImproperlyConfigured(f"DELAYQ['WORKER'][{name!r}]: {exc}") from exc
    return DelayqSettings(redis_url, prefix, database, _queues(raw.get("QUEUES", {})), worker)


def _queues(raw: object) -> dict[str, QueueSettings]:
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("DELAYQ['QUEUES'] must be a dict: queue name -> settings")
    queues = {}
    for name, entry in raw.items():
        where = f"DELAYQ['QUEUES'][{name!r}]"
        if not isinstance(name, str) or not name:
            raise ImproperlyConfigured(f"{where}: a queue name must be a non-empty string")
        if isinstance(entry, str):
            entry = {"HANDLER": entry}
        if not isinstance(entry, dict):
            raise ImproperlyConfigured(f"{where} must be a dotted handler path or a dict")
        _no_unknown(entry, _QUEUE_KEYS, where)
        handler = entry.get("HANDLER")
        if handler is not None and (not isinstance(handler, str) or "." not in handler):
            raise ImproperlyConfigured(
                f"{where}['HANDLER'] must be a dotted path such as 'shop.tasks.close_order'"
            )
        options = entry.get("OPTIONS", {})
        if not isinstance(options, dict):
            raise ImproperlyConfigured(f"{where}['OPTIONS'] must be a dict of DelayQueue options")
        queues[name] = QueueSettings(name, handler, dict(options))
    return queues


def _no_unknown(given: dict[Any, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in given if k not in known)
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown {'key' if len(unknown) == 1 else 'keys'} {', '.join(unknown)} "
            f"(known: {', '.join(sorted(known))})"
        )

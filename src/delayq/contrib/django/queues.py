"""The process's :class:`~delayq.DelayQueue` objects, built from ``DELAYQ`` and shared.

A queue holds a Redis connection pool and is safe to share between threads, so one per name
and process is enough; a change of ``DELAYQ`` (``override_settings`` in tests) closes them.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from ... import DelayQueue
from ...exceptions import ConfigError
from .conf import delayq_settings

_lock = threading.Lock()
_queues: dict[str, DelayQueue] = {}


def get_queue(name: str) -> DelayQueue:
    """The shared :class:`~delayq.DelayQueue` named ``name``, with its ``DELAYQ`` options."""
    with _lock:
        queue = _queues.get(name)
        if queue is None:
            queue = _queues[name] = make_queue(name)
        return queue


def make_queue(name: str) -> DelayQueue:
    """A new :class:`~delayq.DelayQueue` for ``name`` (the caller closes it)."""
    conf = delayq_settings()
    options = conf.queue(name).options
    try:
        return DelayQueue(name, conf.redis_url, prefix=conf.prefix, **options)
    except (ConfigError, TypeError) as exc:
        raise ImproperlyConfigured(f"DELAYQ['QUEUES'][{name!r}]['OPTIONS']: {exc}") from exc


def close_queues() -> None:
    """Close every shared queue (they are made again on next use)."""
    with _lock:
        queues = list(_queues.values())
        _queues.clear()
    for queue in queues:
        queue.close()


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == "DELAYQ":
        close_queues()


setting_changed.connect(_on_setting_changed)

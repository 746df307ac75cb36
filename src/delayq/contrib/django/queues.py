"""The process's connection handle and :class:`~delayq.DelayQueue` objects, from ``DELAYQ``.

One :func:`delayq.connect` handle per process and settings carries every queue: one
connection pool and one pub/sub connection per Redis node, however many queues the project
has (a queue whose ``OPTIONS`` set a ``reconnect_timeout`` of their own goes on a handle with
that budget, one per distinct value). A queue on it is safe to share between threads, so
:func:`get_queue` keeps one per name; a change of ``DELAYQ`` (``override_settings`` in tests)
closes the queues and the handles, and the next use opens them again with the new settings.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from ... import Connection, DelayQueue, connect
from ...exceptions import ConfigError
from .conf import delayq_settings

CLIENT_NAME = "delayq-django"  # the CLIENT SETNAME of the process's connections

_lock = threading.RLock()  # get_queue holds it while make_queue asks for a handle
# reconnect_timeout (None: the default) -> the handle with that retry budget
_connections: dict[Any, Connection] = {}
_queues: dict[str, DelayQueue] = {}


def get_connection(reconnect_timeout: Any = None) -> Connection:
    """The process's connection handle to ``DELAYQ["REDIS_URL"]`` (made on first use), or
    the one with that ``reconnect_timeout``."""
    with _lock:
        return _connection(reconnect_timeout)


def _connection(reconnect_timeout: Any) -> Connection:
    handle = _connections.get(reconnect_timeout)
    if handle is None:
        conf = delayq_settings()
        handle = _connections[reconnect_timeout] = connect(
            conf.redis_url,
            reconnect_timeout=reconnect_timeout,
            prefix=conf.prefix,
            client_name=CLIENT_NAME,
        )
    return handle


def get_queue(name: str) -> DelayQueue:
    """The shared :class:`~delayq.DelayQueue` named ``name``, with its ``DELAYQ`` options."""
    with _lock:
        queue = _queues.get(name)
        if queue is None:
            queue = _queues[name] = make_queue(name)
        return queue


def make_queue(name: str) -> DelayQueue:
    """A new :class:`~delayq.DelayQueue` for ``name`` on the process's handle (the caller
    closes it; :func:`close_queues` closes it too)."""
    conf = delayq_settings()
    options = dict(conf.queue(name).options)
    try:
        handle = get_connection(options.pop("reconnect_timeout", None))
        return handle.queue(name, prefix=conf.prefix, **options)
    except (ConfigError, TypeError) as exc:
        raise ImproperlyConfigured(f"DELAYQ['QUEUES'][{name!r}]['OPTIONS']: {exc}") from exc


def close_queues() -> None:
    """Close every queue of the process's handles, and the handles (made again on next
    use)."""
    with _lock:
        handles = list(_connections.values())
        _connections.clear()
        _queues.clear()
    for handle in handles:
        handle.close()  # its queues first


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting == "DELAYQ":
        close_queues()


setting_changed.connect(_on_setting_changed)

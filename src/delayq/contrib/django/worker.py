"""The worker behind ``manage.py delayq_worker``: the handlers of ``DELAYQ["QUEUES"]`` run
in a thread :class:`~delayq.Worker`, each task between Django's connection housekeeping."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from django.utils.module_loading import import_string

from ... import DelayQueue, Task, Worker
from .conf import delayq_settings
from .queues import make_queue

Handler = Callable[[Task], Any]


def load_handlers(queue_names: Sequence[str]) -> dict[str, Handler]:
    """The handler of each named queue (all queues with a ``HANDLER`` when none are named)."""
    conf = delayq_settings()
    names = list(queue_names) or [q.name for q in conf.queues.values() if q.handler]
    if not names:
        raise ImproperlyConfigured(
            "no queue to work on: name one with --queue, or give a queue a HANDLER in "
            "DELAYQ['QUEUES']"
        )
    handlers = {}
    for name in names:
        path = conf.queue(name).handler
        if path is None:
            raise ImproperlyConfigured(f"DELAYQ['QUEUES'][{name!r}] has no HANDLER")
        try:
            handler = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"the HANDLER of queue {name!r}: {exc}") from exc
        if not callable(handler) or inspect.iscoroutinefunction(handler):
            # Django's ORM is synchronous; the thread worker is the one that fits it.
            raise ImproperlyConfigured(
                f"the HANDLER of queue {name!r} ({path}) must be a plain function of a task"
            )
        handlers[name] = handler
    return handlers


def with_fresh_connections(handler: Handler) -> Handler:
    """Wrap ``handler`` so that each task starts and ends like a Django request: database
    connections past ``CONN_MAX_AGE`` or broken are closed (each worker thread has its own)."""

    def run(task: Task) -> Any:
        close_old_connections()
        try:
            return handler(task)
        finally:
            close_old_connections()

    return run


def build_worker(
    queue_names: Sequence[str], options: dict[str, Any]
) -> tuple[Worker, list[DelayQueue]]:
    """A :class:`~delayq.Worker` on the named queues; ``options`` override ``DELAYQ["WORKER"]``.
    The caller runs it and closes the queues."""
    handlers = {
        name: with_fresh_connections(handler)
        for name, handler in load_handlers(queue_names).items()
    }
    queues = [make_queue(name) for name in handlers]

    def dispatch(task: Task) -> Any:
        assert task.queue is not None  # a worker's tasks always come from one of its queues
        return handlers[task.queue.name](task)

    merged = {**delayq_settings().worker, **options}
    try:
        return Worker(queues, dispatch, **merged), queues
    except (ValueError, TypeError) as exc:
        for queue in queues:
            queue.close()
        raise ImproperlyConfigured(f"DELAYQ['WORKER']: {exc}") from exc

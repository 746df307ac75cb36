"""The celery app of the peer benchmark (see :mod:`bench.peers.celery_peer`).

Run by celery's own CLI, ``python -m celery -A bench.peers.celery_app worker``, with the BENCH_*
variables (:func:`bench.peers.base.bench_env`) in the environment: the module-level ``app`` then
uses ``BENCH_REDIS_URL`` as its broker and ``BENCH_QUEUE`` as its default queue, and its one
task, ``bench.record``, writes the start line to ``BENCH_SINK`` (and holds the task with
``BENCH_HOLD=1``). The enqueue side builds its own app with :func:`make_app`.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from bench.peers.base import ENV_URL, Sink, from_env

TASK_NAME = "bench.record"


def make_app(url: str, queue: str) -> Celery:
    """Celery at its defaults but for the broker URL and the default queue's name."""
    app = Celery("bench", broker=url, set_as_current=False)
    app.conf.task_default_queue = queue  # the run's own queue instead of "celery"
    return app


def die_with_parent() -> None:
    """Linux: SIGKILL this pool process when its parent (the worker's main process) dies.

    The main process is the one the harness starts and kills; without this, a SIGKILLed main
    process would leave its prefork children running with the tasks they hold. It does not
    change how celery itself behaves.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


if ENV_URL in os.environ:  # imported by `celery -A bench.peers.celery_app worker`
    _url, _queue, _sink, _hold = from_env()
    app = make_app(_url, _queue)
    _record = Sink(_sink, _hold)

    @app.task(name=TASK_NAME)
    def record(data: dict[str, Any]) -> None:
        _record.record_payload(data)

    @worker_process_init.connect
    def _pool_process_init(**kwargs: Any) -> None:
        die_with_parent()

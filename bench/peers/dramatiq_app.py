"""The dramatiq worker module of the peer benchmark (see :mod:`bench.peers.dramatiq_peer`).

Run by dramatiq's own CLI, ``python -m dramatiq bench.peers.dramatiq_app --processes 1``, with
the BENCH_* variables (:func:`bench.peers.base.bench_env`) in the environment: it sets a
:class:`RedisBroker` at its defaults on ``BENCH_REDIS_URL`` and declares the one actor,
``record``, on the queue ``BENCH_QUEUE``. The actor writes the start line to ``BENCH_SINK`` (and
holds the task with ``BENCH_HOLD=1``).
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.peers.base import ENV_URL, Sink, from_env

ACTOR_NAME = "record"


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the dramatiq master) dies.

    The master is the process the harness starts and kills; without this, a SIGKILLed master
    would leave its worker process running (and heartbeating) with the tasks it holds. It does
    not change how dramatiq itself behaves.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def make_actor(broker: RedisBroker, queue: str, fn: Any) -> Any:
    """The benchmark's actor on ``queue``, bound to ``broker`` (same name on both sides)."""
    return dramatiq.actor(fn, actor_name=ACTOR_NAME, queue_name=queue, broker=broker)


if ENV_URL in os.environ:  # imported by a dramatiq worker process
    die_with_parent()
    _url, _queue, _sink, _hold = from_env()
    broker = RedisBroker(url=_url)
    dramatiq.set_broker(broker)
    _record = Sink(_sink, _hold)

    def record(data: dict[str, Any]) -> None:
        _record.record_payload(data)

    record_actor = make_actor(broker, _queue, record)

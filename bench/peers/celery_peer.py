"""celery with its Redis broker (kombu's Redis transport) as a peer-benchmark contestant.

Enqueue: ``task.apply_async(args=(payload,), countdown=seconds)``, one call per job, all through
one producer (connection set up before the timed loop). celery has no bulk enqueue: ``group``
publishes its signatures one message at a time (a loop of ``apply_async``), and ``chunks`` packs
many items into ONE task message with one countdown, which cannot give each job its own due
time; so ``bulk=True`` raises :class:`NotImplementedError`.

Worker: celery's CLI, ``python -m celery -A bench.peers.celery_app worker``: one worker node,
prefork pool at the default concurrency (the CPU count: a main process plus that many children).
How celery runs countdown tasks with Redis: the message is in the Redis list at once, carrying
its ETA; a worker takes it right away (raising its prefetch limit for every ETA task), keeps it
unacknowledged in memory and runs it at the ETA from its timer. An unacknowledged message of a
dead worker goes back to the queue only after the transport's ``visibility_timeout`` (1 hour by
default); with the default early ack (``acks_late=False``), a task that had started is gone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from importlib.metadata import version as dist_version
from types import SimpleNamespace

from bench.peers.base import Contestant, Job, payload, python, with_bench_env


class Celery(Contestant):
    name = "celery"
    settings = (
        "Redis broker (kombu Redis transport, visibility_timeout 1 h) at its defaults; default "
        "queue renamed from 'celery' to the benchmark's queue; no result backend (the default); "
        f"one worker node, prefork pool at the default concurrency = CPU count ({os.cpu_count()}); "
        "early ack (default). Holds at most that many running tasks, plus every countdown task "
        "it has fetched (unacked, in memory). Pool processes get PR_SET_PDEATHSIG so that "
        "killing the main process kills them too."
    )

    def version(self) -> str:
        return (
            f"celery {dist_version('celery')}, kombu {dist_version('kombu')}, "
            f"redis-py {dist_version('redis')}"
        )

    def unavailable(self) -> str | None:
        try:
            import celery  # noqa: F401
            import redis
            from kombu.exceptions import VersionMismatch
            from kombu.transport.redis import Channel
        except ImportError as e:
            return f"celery[redis] not installed: {e}"
        try:  # kombu's own check of the redis-py version, run when a channel opens
            Channel._get_client(SimpleNamespace(global_keyprefix=None))
        except VersionMismatch as e:
            return (
                f"kombu {dist_version('kombu')} cannot use redis-py {redis.__version__}: {e} "
                "(kombu<5.7 works with redis-py 5, which bullmq and arq require)"
            )
        return None

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk:
            raise NotImplementedError(
                "celery has no bulk enqueue: group() publishes one message per task, chunks() "
                "puts many items in one task with one countdown"
            )
        from bench.peers.celery_app import TASK_NAME, make_app

        app = make_app(url, queue)

        @app.task(name=TASK_NAME)
        def record(data: object) -> None:  # the enqueue side only needs its name
            pass

        try:
            with app.producer_or_acquire() as producer:
                producer.connection.ensure_connection()
                producer.channel  # noqa: B018 - opens the channel outside the timed loop
                spent = 0.0
                for job in jobs:
                    body = payload(job)
                    t0 = time.perf_counter()
                    countdown = max(0.0, job.due - time.time())
                    record.apply_async(args=(body,), countdown=countdown, producer=producer)
                    spent += time.perf_counter() - t0
            return spent
        finally:
            app.close()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [
            python(),
            "-m",
            "celery",
            "-A",
            "bench.peers.celery_app",
            "worker",
        ]
        return with_bench_env(url, queue, sink, hold, argv)

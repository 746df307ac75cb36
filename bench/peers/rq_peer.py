"""rq: ``Queue.enqueue_in``; one ``rq worker --with-scheduler`` process at its defaults."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta

from .base import Contestant, Job, payload, with_bench_env


class Rq(Contestant):
    name = "rq"
    settings = (
        "defaults (forking Worker, one job at a time, scheduler poll 1 s, job timeout 180 s); "
        "`--with-scheduler` so that the worker moves due jobs itself (rq's delayed jobs need a "
        "scheduler); no bulk API for scheduled jobs (`enqueue_many` enqueues for now)"
    )

    def version(self) -> str:
        from importlib.metadata import version

        return version("rq")

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk:
            raise NotImplementedError("rq has no bulk API for scheduled jobs")
        from redis import Redis
        from rq import Queue

        from . import rq_app

        conn = Redis.from_url(url)
        try:
            conn.ping()
            q = Queue(queue, connection=conn)
            start = time.perf_counter()
            for j in jobs:
                q.enqueue_in(
                    timedelta(seconds=max(0.0, j.due - time.time())), rq_app.handle, payload(j)
                )
            return time.perf_counter() - start
        finally:
            conn.close()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        import shutil
        import sys
        from pathlib import Path

        rq = shutil.which("rq", path=str(Path(sys.executable).parent)) or "rq"
        argv = [rq, "worker", "--with-scheduler", "--url", url, "--quiet", queue]
        return with_bench_env(url, queue, sink, hold, argv)

"""delayq itself: "delayq" (a thread ``Worker``) and "delayq-async" (an ``AsyncWorker``).

Both are started with the ``delayq worker`` command line at its defaults (concurrency 8,
visibility timeout 30 s); the handler module is :mod:`bench.peers.delayq_app`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence

from .base import Contestant, Job, payload, python, with_bench_env

CHUNK = 1000  # offer_many is given the jobs in chunks of this many (it chunks again inside)


def _version() -> str:
    import delayq

    return str(getattr(delayq, "__version__", "?"))


class DelayqThreads(Contestant):
    name = "delayq"
    settings = (
        "defaults (`delayq worker`: thread Worker, concurrency 8, prefetch 32) except the "
        "visibility timeout: 10 s in the full run, 1 s in the smoke run (default 30 s), to keep "
        "the crash scenario short"
    )
    target = "bench.peers.delayq_app:handle"

    def version(self) -> str:
        return _version()

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        from delayq import DelayQueue

        q = DelayQueue(queue, url)
        try:
            q.stats()  # connect (and load scripts) outside the timed part
            spent = 0.0
            if bulk:
                for first in range(0, len(jobs), CHUNK):
                    chunk = jobs[first : first + CHUNK]
                    start = time.perf_counter()
                    now = time.time()
                    q.offer_many([(payload(j), max(0.0, j.due - now)) for j in chunk])
                    spent += time.perf_counter() - start
            else:
                start = time.perf_counter()
                for j in jobs:
                    q.offer(payload(j), delay=max(0.0, j.due - time.time()))
                spent = time.perf_counter() - start
            return spent
        finally:
            q.close()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [python(), "-m", "delayq.cli", "worker", self.target,
                "--queue", queue, "--redis", url, "--log-level", "WARNING"]  # fmt: skip
        visibility = os.environ.get("BENCH_DELAYQ_VISIBILITY")  # set by bench/__main__.py
        if visibility:
            argv += ["--visibility-timeout", visibility]
        return with_bench_env(url, queue, sink, hold, argv)


class DelayqAsync(DelayqThreads):
    name = "delayq-async"
    settings = (
        "defaults (`delayq worker` with an `async def` handler: AsyncWorker, concurrency 8, "
        "prefetch 32) except the visibility timeout: 10 s in the full run, 1 s in the smoke "
        "run (default 30 s); enqueue with AsyncDelayQueue"
    )
    target = "bench.peers.delayq_app:handle_async"

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        return asyncio.run(self._enqueue(url, queue, jobs, bulk))

    async def _enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        from delayq import AsyncDelayQueue

        q = AsyncDelayQueue(queue, url)
        try:
            await q.stats()
            spent = 0.0
            if bulk:
                for first in range(0, len(jobs), CHUNK):
                    chunk = jobs[first : first + CHUNK]
                    start = time.perf_counter()
                    now = time.time()
                    await q.offer_many([(payload(j), max(0.0, j.due - now)) for j in chunk])
                    spent += time.perf_counter() - start
            else:
                start = time.perf_counter()
                for j in jobs:
                    await q.offer(payload(j), delay=max(0.0, j.due - time.time()))
                spent = time.perf_counter() - start
            return spent
        finally:
            await q.close()

"""BullMQ's official Python package (``bullmq`` on PyPI) as a peer-benchmark contestant.

Enqueue: ``Queue.add(name, data, {"delay": ms})`` one call per job, or ``Queue.addBulk`` (one
MULTI/EXEC pipeline of the add script per call) in chunks of :data:`CHUNK` jobs.

Worker: ``python -m bench.peers.bullmq_py_app`` (the package has no CLI): one ``Worker`` at its
defaults, concurrency 1. How BullMQ runs delayed jobs: they wait in the ``delayed`` sorted set; a
worker blocks on the queue's marker key (BZPOPMIN) until the next job's due time, then moves due
jobs to ``wait`` and takes one. A job held by a dead worker goes back once its lock (30 s) has
expired and a worker's stalled-jobs check (every 30 s) has seen it twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from importlib.metadata import version as dist_version

from bench.peers.base import Contestant, Job, payload, python

#: addBulk is given the jobs in chunks of this many (as delayq's offer_many in delayq_peer)
CHUNK = 1000
JOB_NAME = "bench"


def delay_ms(job: Job, now: float) -> int:
    return max(0, round((job.due - now) * 1000))


class BullmqPy(Contestant):
    name = "bullmq-py"
    settings = (
        "defaults: Worker concurrency 1 (so it holds 1 job at a time), lockDuration 30 s, "
        "stalledInterval 30 s, maxStalledCount 1, drainDelay 5 s; job options default (completed "
        f"jobs kept); addBulk in chunks of {CHUNK}; no CLI in the package, so the worker is a "
        "small asyncio script (bench/peers/bullmq_py_app.py); the burst's and the idle "
        "scenario's tasks are preloaded with BullMQ for Node's addBulk when node is here (same "
        "Redis layout, ~15x faster; not a timed part)"
    )

    def version(self) -> str:
        return f"bullmq (Python) {dist_version('bullmq')}, redis-py {dist_version('redis')}"

    def unavailable(self) -> str | None:
        try:
            import bullmq  # noqa: F401
        except ImportError as e:
            return f"bullmq (Python) not installed: {e}"
        return None

    def preloader(self) -> Contestant | None:
        """BullMQ for Node writes the same layout (the Python package runs Node's Lua
        scripts) ~15x faster: the idle scenario's 100,000 tasks take ~5 s instead of ~75 s."""
        from .bullmq_node import BullmqNode

        node = BullmqNode()
        return node if node.unavailable() is None else None

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        return asyncio.run(self._enqueue(url, queue, jobs, bulk))

    async def _enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        from bullmq import Queue

        q = Queue(queue, {"connection": url})
        try:
            await q.client.ping()  # connect outside the timed part
            spent = 0.0
            if bulk:
                for first in range(0, len(jobs), CHUNK):
                    chunk = jobs[first : first + CHUNK]
                    start = time.perf_counter()
                    now = time.time()
                    await q.addBulk(
                        [
                            {
                                "name": JOB_NAME,
                                "data": payload(j),
                                "opts": {"delay": delay_ms(j, now)},
                            }
                            for j in chunk
                        ]
                    )
                    spent += time.perf_counter() - start
            else:
                start = time.perf_counter()
                for j in jobs:
                    await q.add(JOB_NAME, payload(j), {"delay": delay_ms(j, time.time())})
                spent = time.perf_counter() - start
            return spent
        finally:
            await q.close()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        return [python(), "-m", "bench.peers.bullmq_py_app", url, queue, sink, "1" if hold else "0"]

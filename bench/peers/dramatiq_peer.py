"""dramatiq with its Redis broker (``RedisBroker``) as a peer-benchmark contestant.

Enqueue: ``actor.send_with_options(args=(payload,), delay=ms)``, one call per job. dramatiq has
no bulk enqueue: ``group(...).run()`` is a loop of ``broker.enqueue``, one round trip per message,
so ``bulk=True`` raises :class:`NotImplementedError`.

Worker: dramatiq's CLI, ``python -m dramatiq bench.peers.dramatiq_app --processes 1``: a master
process and ONE worker process with the default 8 threads (CLI default would be one process per
CPU). How dramatiq runs delayed messages: they go to the delay queue ``<queue>.DQ``; the worker
prefetches up to threads x 1000 of them, holds them in memory until their eta, then re-enqueues
each onto ``<queue>`` and consumes it from there (idle polling backs off up to 1 s).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from importlib.metadata import version as dist_version

from bench.peers.base import Contestant, Job, payload, python, with_bench_env


def _noop(data: object) -> None:  # the enqueue side only needs the actor's name and queue
    pass


class Dramatiq(Contestant):
    name = "dramatiq"
    settings = (
        "RedisBroker at its defaults (heartbeat_timeout 60 s); actor `record` on the benchmark's "
        "queue name instead of 'default'; CLI `--processes 1` (default: one per CPU) so that it is "
        "ONE worker process, default 8 threads; default middleware (Retries, TimeLimit 10 min, "
        "AgeLimit, ...). Holds at most 8 running tasks (one per thread) plus 16 prefetched and "
        "up to 8,000 delayed ones in memory. Worker process gets PR_SET_PDEATHSIG so that "
        "killing the master kills it too."
    )

    def version(self) -> str:
        return f"dramatiq {dist_version('dramatiq')}, redis-py {dist_version('redis')}"

    def unavailable(self) -> str | None:
        try:
            import dramatiq.brokers.redis  # noqa: F401
        except ImportError as e:
            return f"dramatiq[redis] not installed: {e}"
        return None

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk:
            raise NotImplementedError(
                "dramatiq has no bulk enqueue (group().run() sends one message at a time)"
            )
        from dramatiq.brokers.redis import RedisBroker

        from bench.peers.dramatiq_app import make_actor

        broker = RedisBroker(url=url)
        try:
            actor = make_actor(broker, queue, _noop)
            broker.client.ping()  # connect outside the timed loop
            spent = 0.0
            for job in jobs:
                body = payload(job)
                t0 = time.perf_counter()
                delay_ms = max(0, round((job.due - time.time()) * 1000))
                actor.send_with_options(args=(body,), delay=delay_ms)
                spent += time.perf_counter() - t0
            return spent
        finally:
            broker.close()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [
            python(),
            "-m",
            "dramatiq",
            "bench.peers.dramatiq_app",
            "--processes",
            "1",
        ]
        return with_bench_env(url, queue, sink, hold, argv)

"""arq: ``enqueue_job(_defer_by=...)``; one ``arq`` worker process at its defaults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import timedelta

from .base import Contestant, Job, payload, with_bench_env


class Arq(Contestant):
    name = "arq"
    settings = (
        "defaults (max_jobs 10, poll_delay 0.5 s, job_timeout 300 s); WorkerSettings names the "
        "queue and the Redis URL; no bulk enqueue API"
    )

    def version(self) -> str:
        from importlib.metadata import version

        return version("arq")

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk:
            raise NotImplementedError("arq has no bulk enqueue")
        return asyncio.run(self._enqueue(url, queue, jobs))

    async def _enqueue(self, url: str, queue: str, jobs: Sequence[Job]) -> float:
        from arq import create_pool
        from arq.connections import RedisSettings

        pool = await create_pool(RedisSettings.from_dsn(url), default_queue_name=queue)
        try:
            await pool.ping()
            start = time.perf_counter()
            for j in jobs:
                await pool.enqueue_job(
                    "handle", payload(j), _defer_by=timedelta(seconds=max(0.0, j.due - time.time()))
                )
            return time.perf_counter() - start
        finally:
            await pool.aclose()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        import shutil
        import sys
        from pathlib import Path

        arq = shutil.which("arq", path=str(Path(sys.executable).parent)) or "arq"
        return with_bench_env(url, queue, sink, hold, [arq, "bench.peers.arq_app.WorkerSettings"])

"""saq: ``enqueue(scheduled=...)``; one ``saq`` worker process at its defaults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from .base import Contestant, Job, payload, with_bench_env


class Saq(Contestant):
    name = "saq"
    settings = (
        "defaults (concurrency 10, schedule poll 1 s, job timeout 10 s, sweep 60 s); settings "
        "name the queue; `scheduled` given as a float epoch (the due time itself, not rounded "
        "to whole seconds); no bulk enqueue API (`map` waits for results)"
    )

    def version(self) -> str:
        from importlib.metadata import version

        return version("saq")

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk:
            raise NotImplementedError("saq has no bulk enqueue")
        return asyncio.run(self._enqueue(url, queue, jobs))

    async def _enqueue(self, url: str, queue: str, jobs: Sequence[Job]) -> float:
        from saq import Queue

        q = Queue.from_url(url, name=queue)
        try:
            await q.connect()
            await q.redis.ping()
            start = time.perf_counter()
            for j in jobs:
                await q.enqueue(
                    "handle", scheduled=time.time() + (j.due - time.time()), **payload(j)
                )
            return time.perf_counter() - start
        finally:
            await q.disconnect()

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        import shutil
        import sys
        from pathlib import Path

        saq = shutil.which("saq", path=str(Path(sys.executable).parent)) or "saq"
        return with_bench_env(url, queue, sink, hold, [saq, "bench.peers.saq_app.settings", "-q"])

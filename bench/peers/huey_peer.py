"""huey: ``RedisHuey`` task ``.schedule(delay=...)``; one ``huey_consumer`` at its defaults."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .base import Contestant, Job, payload, with_bench_env


class Huey(Contestant):
    name = "huey"
    settings = (
        "defaults (1 worker thread, scheduler tick 1 s, results on); RedisHuey named after "
        "the queue; no bulk enqueue API"
    )

    def version(self) -> str:
        from importlib.metadata import version

        return version("huey")

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        if bulk:
            raise NotImplementedError("huey has no bulk enqueue")
        from huey import RedisHuey

        huey = RedisHuey(queue, url=url)

        def handle(data: dict) -> None: ...  # the producer side only needs the task's name,

        handle.__module__ = "bench.peers.huey_app"  # which huey prefixes with the module
        handle = huey.task(name="handle")(handle)

        huey.storage.conn.ping()
        start = time.perf_counter()
        for j in jobs:
            handle.schedule(args=(payload(j),), delay=max(0.0, j.due - time.time()))
        spent = time.perf_counter() - start
        huey.storage.conn.close()
        return spent

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        import shutil
        import sys
        from pathlib import Path

        consumer = shutil.which("huey_consumer", path=str(Path(sys.executable).parent))
        argv = [consumer or "huey_consumer", "bench.peers.huey_app.huey", "--quiet"]
        return with_bench_env(url, queue, sink, hold, argv)

"""streaq: ``task.enqueue(...).start(schedule=...)`` / ``enqueue_many``; one ``streaq run``.

How streaq runs delayed tasks: enqueueing puts the task's data under its own key and its id in
a sorted set (the delayed queue), scored by the due time in ms. Each worker's
``schedule_delayed_tasks`` loop runs a Redis function that moves due ids onto the queue's stream,
then sleeps so that one pass starts every 0.5 s (a constant, not a setting); the worker reads the
stream with XREADGROUP, up to ``prefetch`` (default: ``concurrency``) tasks beyond those running.
A task held by a dead worker is reclaimed from the stream's pending list once idle for
``idle_timeout`` (60 s by default). streaq uses coredis, hence ``.venv-bench-streaq``. No tuned
row: the 0.5-s pass is not configurable, and the other defaults are what one would run.
"""

from __future__ import annotations

from ._own_venv import OwnVenvContestant
from .base import with_bench_env


class Streaq(OwnVenvContestant):
    name = "streaq"
    venv = "streaq"
    app = "bench.peers.streaq_app"
    dists = ("streaq", "coredis")
    settings = (
        "defaults (concurrency 16, prefetch 16 more on top, delayed-task pass every 0.5 s, "
        "idle_timeout 60 s, task results kept 5 min, pickle); Worker named after the queue; the "
        "task is `silent` (its CLI logs every task at INFO, with no quieter level); "
        "`start(schedule=due)` one by one, `enqueue_many` (one pipeline) in bulk. Holds up to "
        "16 running tasks and 16 read ahead (both stay with a killed worker until idle_timeout)."
    )

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [self.script("streaq"), "run", f"{self.app}:worker"]
        return with_bench_env(url, queue, sink, hold, argv)

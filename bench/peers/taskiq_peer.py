"""taskiq with taskiq-redis: ``schedule_by_time`` on a ``ListRedisScheduleSource``, run by
``taskiq scheduler`` into a ``RedisStreamBroker``; one ``taskiq worker`` plus the scheduler.

How taskiq runs delayed tasks: taskiq has no delay of its own; a task for later is a schedule
(``schedule_by_time``) in a schedule source. ``ListRedisScheduleSource`` keeps each schedule's
data under its own key and its id in a list per due minute. The scheduler process reads the
source's schedules every ``--update-interval`` (60 s by default): the lists of the current minute
and, on every read (taskiq-redis 1.2.4 says "only during the first run" but does it each time),
those of past minutes, found by SCANning the keyspace. Every ``--loop-interval`` (1 s, whole
seconds) it sends the ones whose time has come to the broker and deletes them from the source
(GETDEL + LREM). The worker reads the broker's stream with XREADGROUP (block 2 s) and acks
once the result is saved; a message held by a dead worker is reclaimed (XAUTOCLAIM) after
``idle_timeout`` (10 min). taskiq-redis needs redis-py >= 8, hence ``.venv-bench-taskiq``.
"""

from __future__ import annotations

from ._own_venv import OwnVenvContestant
from .base import with_bench_env

#: the tuned row's ``taskiq scheduler --update-interval`` (seconds; the smallest it takes)
TUNED_UPDATE_INTERVAL_S = 1


class Taskiq(OwnVenvContestant):
    name = "taskiq"
    venv = "taskiq"
    app = "bench.peers.taskiq_app"
    dists = ("taskiq", "taskiq-redis", "redis")
    has_bulk = False
    scheduler_args: tuple[str, ...] = ()
    settings = (
        "`taskiq worker --workers 1` (default 2 processes; one worker process here, as "
        "dramatiq's) plus `taskiq scheduler` at its defaults (schedules re-read every 60 s, "
        "sends checked every 1 s), both `--log-level WARNING` (INFO logs every task); "
        "RedisStreamBroker (the acknowledging one taskiq-redis's README leads with) named after "
        "the queue, no result backend, ack when saved, up to 100 async tasks at once; "
        "ListRedisScheduleSource (what taskiq's docs suggest for dynamic schedules) at its "
        "defaults. A task for later: `schedule_by_time(source, due)`; one already due: "
        "`kiq()` (taskiq's way to run a task now; the warm-up and crash tasks). No bulk API for "
        "schedules. At the 60-s re-read, a task due within the minute runs up to a minute late."
    )

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [self.python(), "-m", self.app, "serve", *self.scheduler_args]
        return with_bench_env(url, queue, sink, hold, argv)


class TaskiqTuned(Taskiq):
    name = "taskiq-tuned"
    scheduler_args = ("--update-interval", str(TUNED_UPDATE_INTERVAL_S))
    settings = (
        f"as taskiq, but `taskiq scheduler --update-interval {TUNED_UPDATE_INTERVAL_S}` "
        "(seconds, the smallest it takes) instead of 60: at the default a task scheduled less "
        "than a minute ahead waits up to 60 s for the next re-read, which nobody scheduling "
        "by the second would run; costs a re-read of the source (with a SCAN of the keyspace) "
        "every second. The 1-s send loop (`--loop-interval`, whole seconds) stays."
    )

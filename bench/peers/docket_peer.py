"""docket (``pydocket``): ``docket.add(fn, when=...)`` / ``add_many``; one ``docket worker``.

How docket runs delayed tasks: ``add`` puts the task's data in a hash and its key in a sorted
set (the docket's queue), scored by its due time. Each worker's scheduler loop runs a Lua script
every ``scheduling_resolution`` (250 ms by default) that moves the due ones onto a stream; the
worker reads the stream with XREADGROUP (blocking up to ``minimum_check_interval``, 100 ms in the
CLI). While all ``concurrency`` slots are taken the loop sleeps ``minimum_check_interval``
before it reads again, so a worker at the defaults starts at most about 10 tasks per 100 ms
however short they are: ~100 tasks/s in the burst, and a backlog in the steady scenario
(200 tasks/s) once a 250-ms pass moves more tasks than there are slots. A task held by a dead
worker stays in the stream's pending list until a live worker's sweep (XAUTOCLAIM, every
quarter of ``redelivery_timeout``) finds it idle for ``redelivery_timeout`` (5 min by default).
docket needs redis-py >= 6, hence ``.venv-bench-docket``.
"""

from __future__ import annotations

from ._own_venv import OwnVenvContestant
from .base import with_bench_env

#: the tuned row's scheduling resolution
TUNED_RESOLUTION_MS = 10


class Docket(OwnVenvContestant):
    name = "docket"
    venv = "docket"
    app = "bench.peers.docket_app"
    dists = ("pydocket", "redis")
    settings = (
        "defaults of `docket worker` (concurrency 10, scheduling_resolution 250 ms, "
        "minimum_check_interval 100 ms, redelivery_timeout 5 min); the docket named after "
        "the queue; `--logging-level WARNING` (INFO logs every task, as saq's and rq's "
        "workers are run quiet); `add(when=due)` one by one, `add_many` (pipelined, 1,000 per "
        "round trip) in bulk. Holds up to 10 running tasks. While its 10 slots are full the "
        "worker sleeps 100 ms (minimum_check_interval) before reading again: ~100 tasks/s at "
        "most, however short the tasks."
    )

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [
            self.script("docket"),
            "worker",
            "--tasks",
            f"{self.app}:tasks",
            "--docket",
            queue,
            "--url",
            url,
            "--logging-level",
            "WARNING",
        ]
        return with_bench_env(url, queue, sink, hold, argv)


class DocketTuned(Docket):
    name = "docket-tuned"
    settings = (
        f"as docket, but scheduling_resolution {TUNED_RESOLUTION_MS} ms instead of 250 ms: at "
        "the default a due task waits up to 250 ms for the scheduler loop to move it, where "
        "someone who schedules by the millisecond would poll more often; costs one Lua call "
        f"per {TUNED_RESOLUTION_MS} ms while idle. Run through `Worker.run` (what the CLI calls, "
        "with its other defaults): the CLI parses durations as whole seconds."
    )

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        argv = [
            self.python(),
            "-m",
            self.app,
            "worker",
            "--scheduling-resolution-ms",
            str(TUNED_RESOLUTION_MS),
            url,
            queue,
        ]
        return with_bench_env(url, queue, sink, hold, argv)

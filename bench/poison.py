"""One poisonous task among 1,000 healthy ones (issue #14): ``python -m bench.poison``.

```console
$ .venv/bin/python -m bench.poison                  # 5 rounds per worker kind
$ .venv/bin/python -m bench.poison --rounds 9 --concurrency 2
```

For each worker kind (the thread ``Worker`` and the ``AsyncWorker``) and each round, two runs
on fresh queues of one private redis-server (the one on PATH, on a free port of 127.0.0.1):

``clean``
    1,000 healthy tasks due now; a worker starts and handles them (no-op handlers).
``poisoned``
    the same 1,000, plus one task offered first whose handler raises an error with a lone
    surrogate in its message (``"bad \\udcff"``): the failure that once killed a handler slot
    on every delivery. ``max_attempts=3``, backoff 0.05 s, so it is retried twice and then
    dead-lettered during the run.

Each run's time is from the worker starting to its handler seeing the last healthy task. The
rounds of the two runs alternate, and the medians are reported with their difference; the bar
is that the poisoned run is within 2 s of the clean one. Each run also checks that every
healthy task was handled once (none lost or repeated) and, for the poisoned run, that the
poison ended up dead-lettered.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from delayq import AsyncDelayQueue, AsyncWorker, Backoff, DelayQueue, Worker
from delayq.embedded import EmbeddedRedis

HEALTHY = 1000
BAR_S = 2.0
POISON = "poison"


class Run:
    """One worker run on a fresh queue: counts the healthy tasks its handler sees."""

    def __init__(self, url: str, kind: str, poisoned: bool, concurrency: int) -> None:
        self.url, self.kind, self.poisoned, self.concurrency = url, kind, poisoned, concurrency
        self.prefix = f"bench-poison-{uuid.uuid4().hex[:8]}"
        self.seen: list[Any] = []
        self.all_seen = threading.Event()
        self.stopper: Callable[[], None] | None = None
        self.failure: BaseException | None = None

    def _options(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "retry_backoff": Backoff(base=0.05, max=0.05, jitter=0)}

    def _saw(self, payload: Any) -> None:
        if payload == POISON:
            raise RuntimeError("bad \udcff")
        self.seen.append(payload)
        if len(self.seen) == HEALTHY:
            self.all_seen.set()

    def measure(self) -> float:
        with DelayQueue("p", self.url, **self._options()) as q:
            if self.poisoned:
                q.offer(POISON)
            q.offer_many([(i, 0) for i in range(HEALTHY)])
            thread = threading.Thread(target=self._main, daemon=True)
            started = time.perf_counter()
            thread.start()
            if not self.all_seen.wait(60):
                raise SystemExit(f"{self.kind}: the healthy tasks were not all handled in 60 s")
            took = time.perf_counter() - started
            deadline = time.monotonic() + 10
            while self.poisoned and q.stats().dead != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            stats = q.stats()
            while self.stopper is None:  # set by the worker thread before run() starts
                time.sleep(0.001)
            self.stopper()
            thread.join(15)
            if self.failure is not None:
                raise self.failure
            if sorted(self.seen) != list(range(HEALTHY)):
                raise SystemExit(f"{self.kind}: healthy tasks lost or repeated")
            if stats.dead != int(self.poisoned):
                raise SystemExit(f"{self.kind}: the poison was not dead-lettered ({stats})")
            q.purge(("dead",))
        return took

    def _main(self) -> None:
        try:
            if self.kind == "thread":
                with DelayQueue("p", self.url, **self._options()) as q:
                    worker = Worker(
                        q, lambda task: self._saw(task.payload), concurrency=self.concurrency,
                        max_attempts=3, handle_signals=False,
                    )  # fmt: skip
                    self.stopper = worker.stop
                    worker.run()
            else:
                asyncio.run(self._async_main())
        except BaseException as exc:  # reported by measure()
            self.failure = exc

    async def _async_main(self) -> None:
        async def handler(task: Any) -> None:
            self._saw(task.payload)

        loop = asyncio.get_running_loop()
        async with AsyncDelayQueue("p", self.url, **self._options()) as q:
            worker = AsyncWorker(
                q, handler, concurrency=self.concurrency, max_attempts=3, handle_signals=False
            )
            self.stopper = lambda: loop.call_soon_threadsafe(worker.stop)
            await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH")
    server = EmbeddedRedis(binary).start()
    try:
        print(f"{HEALTHY} healthy tasks, concurrency {args.concurrency}, {args.rounds} rounds")
        print(f"{'worker':<8} {'clean s':>8} {'poisoned s':>11} {'diff s':>7}  bar (<= {BAR_S} s)")
        for kind in ("thread", "async"):
            clean: list[float] = []
            poisoned: list[float] = []
            for _ in range(args.rounds):
                clean.append(Run(server.url, kind, False, args.concurrency).measure())
                poisoned.append(Run(server.url, kind, True, args.concurrency).measure())
            a, b = statistics.median(clean), statistics.median(poisoned)
            verdict = "met" if b - a <= BAR_S else "MISSED"
            print(f"{kind:<8} {a:>8.3f} {b:>11.3f} {b - a:>+7.3f}  {verdict}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

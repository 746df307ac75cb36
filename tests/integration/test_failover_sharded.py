"""A 16-shard queue on a replicated cluster: 100,000 tasks offered and delivered exactly once
while one master fails over gracefully in the middle of the drain (issue #10)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from delayq import AsyncDelayQueue, AsyncWorker

from ..conftest import BINARIES
from ..topology import ReplicatedCluster, running

pytestmark = [pytest.mark.topology, pytest.mark.timeout(240)]
TASKS = 100_000


async def test_sixteen_shards_deliver_100000_tasks_exactly_once_across_a_failover(
    prefix: str,
) -> None:
    with running(ReplicatedCluster(BINARIES[0][1])) as cluster:
        async with AsyncDelayQueue(
            "promo", cluster.url, prefix=prefix, shards=16, visibility_timeout=30
        ) as q:
            ids: list[str] = []
            for start in range(0, TASKS, 10_000):
                ids += await q.offer_many([(n, 0) for n in range(start, start + 10_000)])
            assert len(set(ids)) == TASKS
            seen: Counter[str] = Counter()

            async def handle(task: object) -> None:
                seen[task.id] += 1  # type: ignore[attr-defined]

            worker = AsyncWorker(q, handle, concurrency=32)
            running_worker = asyncio.create_task(worker.run())
            deadline = time.monotonic() + 60
            while len(seen) < TASKS // 4:  # a quarter done: fail a master over mid-drain
                assert time.monotonic() < deadline, f"only {len(seen)} handled"
                await asyncio.sleep(0.05)
            victim = cluster.masters()[0]
            replica = cluster.replicas_of(victim)[0]
            done = threading.Event()
            handled_by_then: list[int] = []

            def fail_over() -> None:
                cluster.failover(replica)
                handled_by_then.append(len(seen))
                done.set()

            threading.Thread(target=fail_over, daemon=True).start()
            deadline = time.monotonic() + 120
            while len(seen) < TASKS:
                assert time.monotonic() < deadline, f"only {len(seen)} of {TASKS} handled"
                await asyncio.sleep(0.1)
            worker.stop()
            await running_worker
            assert done.wait(30), "the failover did not complete"
            stats = await q.stats()
    assert handled_by_then[0] < TASKS, "the drain ended before the failover did"
    assert set(seen) == set(ids), "a task was lost"
    duplicated = [task_id for task_id, n in seen.items() if n > 1]
    assert duplicated == [], f"{len(duplicated)} tasks delivered twice"
    assert (stats.ready, stats.inflight, stats.delayed) == (0, 0, 0)

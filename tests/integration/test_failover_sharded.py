"""A 16-shard queue on a replicated cluster: 100,000 tasks offered and delivered exactly once
while one master fails over (gracefully, or SIGKILLed) in the middle of the drain; then the
exporter and the dashboard read the queue from the new masters by themselves (issue #10)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import httpx
import pytest

from delayq import AsyncDelayQueue, AsyncWorker
from delayq.dashboard import Settings, create_app
from delayq.metrics import QueueCollector

from ..conftest import BINARIES
from ..topology import ReplicatedCluster, running

pytestmark = [pytest.mark.topology, pytest.mark.timeout(240)]
TASKS = 100_000


@pytest.mark.parametrize("fault", ["failover", "kill"])
async def test_sixteen_shards_deliver_100000_tasks_exactly_once_across_a_failover(
    prefix: str, fault: str
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
                if fault == "failover":
                    cluster.failover(replica)
                else:
                    victim.kill()
                    cluster.wait_for_new_master(victim)
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
            # The operator views find the new masters by themselves, on the same URL.
            collector = QueueCollector(cluster.url, prefix=prefix)
            try:
                (exported,) = await asyncio.to_thread(collector.read)
            finally:
                collector.close()
            app = create_app(Settings(redis_url=cluster.url, prefix=prefix))
            web = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
            )
            try:
                page = await web.get("/")
            finally:
                await web.aclose()
                await app.state.dashboard.monitor.close()
    assert exported.counters["acked"] >= TASKS and len(exported.shards) == 16
    assert page.status_code == 200 and 'data-queue="promo"' in page.text
    assert handled_by_then[0] < TASKS, "the drain ended before the failover did"
    assert set(seen) == set(ids), "a task was lost"
    duplicated = [task_id for task_id, n in seen.items() if n > 1]
    if fault == "failover":  # exactly once; a kill may lose a fetch it never replicated,
        assert duplicated == [], f"{len(duplicated)} tasks delivered twice"  # = a redelivery
    else:
        assert len(duplicated) < 1000, f"{len(duplicated)} tasks delivered twice"
    assert (stats.ready, stats.inflight, stats.delayed) == (0, 0, 0)

"""Limits and pause on a real Redis Cluster (issue #20): every flow-control key a script
derives carries the queue's hash tag, so each script still touches one slot; a sharded
queue's limit key keeps its tasks on one shard (one node)."""

from __future__ import annotations

import threading
import time

import pytest

from delayq import DelayQueue, Limit, Offer, RateLimited, Worker
from delayq.embedded import EmbeddedCluster
from tests.cluster_support import cluster_url

pytest_plugins = ["tests.cluster_support"]
pytestmark = pytest.mark.topology


def test_limits_pause_and_a_429_on_a_cluster(cluster: EmbeddedCluster, prefix: str) -> None:
    with DelayQueue("lc", cluster_url(cluster), prefix=prefix, safety_interval=30) as q:
        q.limits.set("t", Limit(concurrency=1, rate=50))
        q.offer_many([Offer(i, 0, limit_key="t") for i in range(3)])
        first = q.poll_many(10, timeout=3)
        assert [t.payload for t in first] == [0]
        assert q.limits.get("t").waiting == 2
        q.pause()
        first[0].ack()  # acked while paused; the freed slot's waiter waits for resume
        assert q.poll(timeout=0.3) is None and q.stats().paused
        q.resume()
        second = q.poll(timeout=3)
        assert second is not None and second.payload == 1
        second.throttle(0.3)  # RateLimited from a handler does this
        started = time.monotonic()
        again = q.poll(timeout=5)
        assert again is not None and again.payload == 1 and again.attempts == 1
        assert time.monotonic() - started >= 0.25
        again.ack()
        assert [row.key for row in q.limits.list()][:1] == ["t"]


def test_a_sharded_queue_on_a_cluster_keeps_a_key_on_one_shard(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    with DelayQueue("lcs", cluster_url(cluster), prefix=prefix, shards=3) as q:
        q.limits.set("tenant", Limit(concurrency=2))
        q.offer_many([Offer(i, 0, limit_key="tenant") for i in range(6)])
        q.offer_many([(f"free{i}", 0) for i in range(6)])
        seen: list[object] = []
        running = threading.Semaphore(0)
        peak = [0, 0]
        lock = threading.Lock()

        def handler(task) -> None:
            if isinstance(task.payload, int):
                with lock:
                    peak[0] += 1
                    peak[1] = max(peak[1], peak[0])
                time.sleep(0.05)
                with lock:
                    peak[0] -= 1
            seen.append(task.payload)
            if len(seen) == 13:  # 12 tasks, free0 twice (its RateLimited attempt is not counted)
                running.release()
            if task.payload == "free0" and task.attempts == 1:
                raise RateLimited(0.1)  # an unkeyed task holds its shard for a moment

        worker = Worker(q, handler, concurrency=8)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            assert running.acquire(timeout=20), seen
        finally:
            worker.stop()
            thread.join(10)
        assert peak[1] <= 2, "more than 2 of the key's tasks ran at once across shards"
        assert sorted(p for p in seen if isinstance(p, int)) == list(range(6))

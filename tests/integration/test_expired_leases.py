"""Expired leases are their own state (issue #22): a task whose consumer died holding it is
not "inflight and ok" but ``expired`` until a fetch reclaims it, in ``Stats``, ``get``,
``tasks``, ``purge``, ``delayq stats`` and ``inspect``, the exporter and the dashboard's flag.
Both Redis versions (the stats, info, tasks and purge scripts changed)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delayq import DelayQueue, Stats, TaskState
from delayq.dashboard.series import History, health
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 0.3


def abandon(q: DelayQueue, n: int, keep: int = 0) -> tuple[list[str], list[str]]:
    """Offer ``n`` tasks and take them as a consumer that then dies, except that ``keep``
    of them get a long lease (a consumer still at work). Returns (abandoned, kept) ids."""
    ids = [q.offer({"n": i}) for i in range(n)]
    tasks = q.poll_many(n)
    while len(tasks) < n:  # a sharded queue hands out one shard's at a time
        tasks += q.poll_many(n - len(tasks), timeout=1)
    assert sorted(t.id for t in tasks) == sorted(ids)
    for task in tasks[:keep]:
        task.extend(300)
    wait_until(lambda: q.stats().expired == n - keep, timeout=10)
    return [t.id for t in tasks[keep:]], [t.id for t in tasks[:keep]]


def test_a_lapsed_lease_is_expired_everywhere_until_a_fetch_reclaims_it(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("orders", visibility_timeout=LEASE_S)
    (gone, *others), (kept,) = abandon(q, 4, keep=1)
    stats = q.stats()
    assert (stats.inflight, stats.expired, stats.total) == (1, 3, 4)

    info = q.get(gone)
    assert info is not None and info.state is TaskState.EXPIRED
    assert info.lease_expires_at is not None and info.lease_expires_at < datetime.now(UTC)
    live = q.get(kept)
    assert live is not None and live.state is TaskState.INFLIGHT

    expired = q.tasks("expired")
    assert {t.id for t in expired} == {gone, *others}
    assert all(t.state is TaskState.EXPIRED for t in expired)
    assert [t.id for t in q.tasks("inflight")] == [kept]
    # Pages split the lease set at its expired head: no task on two pages, none missed.
    paged = [t.id for off in range(4) for t in q.tasks("expired", limit=1, offset=off)]
    assert sorted(paged) == sorted([gone, *others])
    assert [t.id for t in q.tasks("inflight", limit=1, offset=1)] == []

    q.poll_many(10)  # a consumer is back: its fetch reclaims them (retried after backoff)
    after = q.stats()
    assert after.expired == 0 and after.delayed + after.ready + after.inflight == 4
    reclaimed = q.get(gone)
    assert reclaimed is not None and reclaimed.state is not TaskState.EXPIRED


def test_purge_tells_expired_from_live_leases(make_queue: Callable[..., DelayQueue]) -> None:
    q = make_queue("orders", visibility_timeout=LEASE_S)
    _, kept = abandon(q, 3, keep=1)
    assert q.purge("expired") == 2
    assert [t.id for t in q.tasks("inflight")] == kept and q.stats().expired == 0
    abandon(q, 2)
    assert q.purge(["inflight"]) == 1  # the live lease only
    assert q.stats().expired == 2
    assert q.purge(["inflight", "expired"]) == 2
    assert q.stats().total == 0


def test_a_sharded_queue_sums_its_shards_expired_leases(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("sharded", shards=4, visibility_timeout=LEASE_S)
    gone, _ = abandon(q, 12)
    stats = q.stats()
    assert stats.expired == 12 and sum(part.expired for part in stats.shards) == 12
    assert sorted(t.id for t in q.tasks("expired", limit=100)) == sorted(gone)


def test_the_cli_shows_expired_leases(
    redis_server: EmbeddedRedis, prefix: str, make_queue: Callable[..., DelayQueue]
) -> None:
    q = make_queue("orders", visibility_timeout=LEASE_S)
    (gone,), _ = abandon(q, 1)
    target = ["--redis", redis_server.url, "--prefix", prefix]

    def cli(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "delayq.cli", *args, *target], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc
        return proc.stdout

    (row,) = json.loads(cli("stats", "orders", "--json"))
    assert (row["inflight"], row["expired"], row["total"]) == (0, 1, 1)
    header, line = cli("stats", "orders").splitlines()
    assert header.split()[:6] == ["queue", "delayed", "ready", "inflight", "expired", "dead"]
    assert line.split()[:6] == ["orders", "0", "0", "0", "1", "0"]
    listed = cli("inspect", "orders")
    assert "orders: expired (1 shown)" in listed and "orders: inflight" not in listed
    assert gone in listed and "ago" in listed  # its lease ran out some time ago
    (task,) = json.loads(cli("inspect", "orders", "--state", "expired", "--json"))
    assert task["state"] == "expired" and task["id"] == gone
    assert json.loads(cli("get", "orders", gone, "--json"))["state"] == "expired"


def test_the_exporter_counts_expired_leases(
    redis_server: EmbeddedRedis, prefix: str, make_queue: Callable[..., DelayQueue]
) -> None:
    pytest.importorskip("prometheus_client")
    from delayq.metrics import QueueCollector

    q = make_queue("orders", visibility_timeout=LEASE_S)
    abandon(q, 2, keep=1)
    collector = QueueCollector(redis_server.url, prefix=prefix, queues=["orders"])
    try:
        page = collector.render()
    finally:
        collector.close()
    assert 'delayq_tasks{queue="orders",state="expired"} 1' in page
    assert 'delayq_tasks{queue="orders",state="inflight"} 1' in page


def test_the_dashboard_flags_expired_leases_with_no_consumer_as_stuck() -> None:
    now = datetime.now(UTC)
    orphaned = Stats("q", 0, 0, 0, 0, 0, 0.0, None, expired=2,
                     consumer_seen_at=now - timedelta(minutes=5))  # fmt: skip
    assert health(orphaned, now, History()) == "stuck"
    never_seen = Stats("q", 0, 0, 0, 0, 0, 0.0, None, expired=1)
    assert health(never_seen, now, History()) == "stuck"
    # Consumers fetching now reclaim an expired lease at their next fetch: no flag.
    reclaimed_soon = Stats("q", 0, 0, 0, 0, 0, 0.0, None, expired=1, consumer_seen_at=now)
    assert health(reclaimed_soon, now, History()) == "ok"

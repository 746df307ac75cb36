"""Prometheus metrics: the exporter's queue gauges against ``stats()``, worker-side metrics,
Redis down, and the CLI (``delayq exporter``, ``delayq worker --metrics-port``) as processes.

Metrics do not depend on the Redis version (the ``stats`` script is tested on every version
elsewhere), so these tests use the newest server only, and a fresh ``CollectorRegistry`` each.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from redis.cluster import RedisCluster

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, Reject, Stats, Worker
from delayq.cli import main
from delayq.embedded import EmbeddedCluster, EmbeddedRedis, free_port
from delayq.metrics import QueueCollector, WorkerMetrics, start_exporter
from tests.conftest import BINARIES
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition, keyed by (name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return parse(response.read().decode())


@pytest.fixture
def queue(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[Callable[..., DelayQueue]]:
    made: list[DelayQueue] = []

    def make(name: str, **options: Any) -> DelayQueue:
        q = DelayQueue(name, redis7_server.url, prefix=prefix, **options)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


def check_queue(samples: Samples, stats: Stats) -> None:
    """The samples of one queue say what ``stats()`` says."""
    name = stats.queue
    for state in ("delayed", "ready", "inflight", "dead"):
        assert value(samples, "delayq_tasks", queue=name, state=state) == getattr(stats, state)
    assert value(samples, "delayq_overdue_tasks", queue=name) == stats.overdue
    age = value(samples, "delayq_oldest_overdue_age_seconds", queue=name)
    assert age is not None and age == pytest.approx(stats.oldest_overdue_age, abs=2.0)
    next_due = value(samples, "delayq_next_due_timestamp_seconds", queue=name)
    if stats.next_due_at is None:
        assert next_due is None
    else:
        assert next_due == pytest.approx(stats.next_due_at.timestamp(), abs=1e-3)
    seen = value(samples, "delayq_consumer_last_seen_timestamp_seconds", queue=name)
    if stats.consumer_seen_at is None:
        assert seen is None
    else:
        assert seen == pytest.approx(stats.consumer_seen_at.timestamp(), abs=1e-3)
    for field in ("offered", "delivered", "acked", "retried", "dead_lettered", "cancelled",
                  "expired", "lease_expired", "decode_failures", "requeued", "purged"):  # fmt: skip
        got = value(samples, f"delayq_{field}_total", queue=name)
        assert got == stats.counters.get(field, 0), field
    # The histogram: cumulative buckets from the non-cumulative ones, count = deliveries.
    running = 0
    for bound, count in sorted(stats.lateness.items()):
        running += count
        le = "+Inf" if math.isinf(bound) else repr(float(bound))
        assert value(samples, "delayq_delivery_lateness_seconds_bucket", queue=name, le=le) == (
            running
        )
    count = value(samples, "delayq_delivery_lateness_seconds_count", queue=name)
    assert count == running == stats.counters.get("delivered", 0)
    assert value(samples, "delayq_delivery_lateness_seconds_sum", queue=name) == pytest.approx(
        stats.lateness_sum
    )


def test_exporter_scrape_equals_stats_for_queues_in_every_state(
    redis7_server: EmbeddedRedis, prefix: str, queue: Callable[..., DelayQueue]
) -> None:
    waiting = queue("waiting")
    waiting.offer_many([({"n": i}, 3600) for i in range(3)] + [({"n": 9}, 0)] * 2)
    busy = queue("busy", max_attempts=2)
    busy.offer_many([({"n": i}, 0) for i in range(6)])
    got = busy.poll_many(6, timeout=5)
    assert len(got) == 6
    busy.ack(got[0])
    busy.retry(got[1], delay=3600, error="boom")  # back to delayed
    busy.reject(got[2], "bad")  # dead
    busy.cancel(busy.offer({"n": 7}, delay=60))
    # got[3:] stay inflight
    empty = queue("empty")
    empty.offer("x", delay=0)
    empty.ack(empty.take())

    server = start_exporter(redis7_server.url, port=0, prefix=prefix)
    try:
        samples = scrape(server.url)
        stats = [q.stats() for q in (waiting, busy, empty)]
    finally:
        server.stop()
    assert value(samples, "delayq_exporter_up") == 1
    for s in stats:
        check_queue(samples, s)
    assert stats[1].inflight == 3 and stats[1].dead == 1 and stats[1].delayed == 1
    assert value(samples, "delayq_acked_total", queue="busy") == 1
    assert value(samples, "delayq_retried_total", queue="busy") == 1
    assert value(samples, "delayq_dead_lettered_total", queue="busy") == 1
    assert value(samples, "delayq_cancelled_total", queue="busy") == 1
    assert value(samples, "delayq_offered_total", queue="busy") == 7
    assert value(samples, "delayq_delivery_lateness_seconds_count", queue="busy") == 6
    assert value(samples, "delayq_delivery_lateness_seconds_count", queue="waiting") == 0
    assert value(samples, "delayq_consumer_last_seen_timestamp_seconds", queue="waiting") is None
    assert value(samples, "delayq_next_due_timestamp_seconds", queue="empty") is None


def test_listed_queues_only_and_counters_follow(
    redis7_server: EmbeddedRedis, prefix: str, queue: Callable[..., DelayQueue]
) -> None:
    a, b = queue("a"), queue("b")
    a.offer(1, delay=0)
    b.offer(2, delay=0)
    registry = CollectorRegistry()
    collector = QueueCollector(redis7_server.url, prefix=prefix, queues=["a"])
    registry.register(collector)
    try:
        first = parse(generate_latest(registry).decode())
        assert value(first, "delayq_offered_total", queue="a") == 1
        assert value(first, "delayq_offered_total", queue="b") is None
        a.ack(a.take())
        second = parse(generate_latest(registry).decode())
    finally:
        collector.close()
    assert value(second, "delayq_acked_total", queue="a") == 1
    assert value(second, "delayq_delivered_total", queue="a") == 1
    assert value(second, "delayq_delivery_lateness_seconds_count", queue="a") == 1


def test_scrape_survives_a_script_flush(
    redis7_server: EmbeddedRedis, prefix: str, queue: Callable[..., DelayQueue]
) -> None:
    queue("q").offer(1, delay=60)
    collector = QueueCollector(redis7_server.url, prefix=prefix)
    try:
        collector.read()
        redis.Redis.from_url(redis7_server.url).script_flush()
        (stats,) = collector.read()
    finally:
        collector.close()
    assert stats.delayed == 1


def test_cluster_reads_every_queue_on_its_node(prefix: str) -> None:
    """redis-py refuses EVALSHA in cluster pipelines: the collector calls per queue there."""
    with EmbeddedCluster(3, BINARIES[0][1]) as cluster:
        client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        try:
            names = ["orders", "stock", "mail", "receipts", "reminders"]  # spread over nodes
            for name in names:
                DelayQueue(name, client, prefix=prefix).offer_many([(1, 0), (2, 60)])
            client.script_flush()
            collector = QueueCollector(client, prefix=prefix)
            samples = parse(collector.render())
        finally:
            client.close()
    assert value(samples, "delayq_exporter_up") == 1
    for name in names:
        assert value(samples, "delayq_tasks", queue=name, state="ready") == 1
        assert value(samples, "delayq_tasks", queue=name, state="delayed") == 1


def test_redis_down_answers_with_exporter_up_0() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    server = start_exporter(dead, port=0, queues=["q"])
    try:
        samples = scrape(server.url)
    finally:
        server.stop()
    assert value(samples, "delayq_exporter_up") == 0
    assert value(samples, "delayq_tasks", queue="q", state="ready") is None
    assert value(samples, "delayq_exporter_scrape_duration_seconds") is not None


# -- worker side ---------------------------------------------------------------------------


def handle(task: Any) -> None:
    kind = task.payload["kind"]
    if kind == "fail":
        raise RuntimeError("handler failed")
    if kind == "reject":
        raise Reject("unusable")
    if kind == "lost":
        task.queue.purge("inflight")  # the lease is gone: the failure cannot be recorded
        raise RuntimeError("too late")


async def handle_async(task: Any) -> None:
    if task.payload["kind"] == "lost":
        await task.queue.purge("inflight")
        raise RuntimeError("too late")
    handle(task)


def check_worker(registry: CollectorRegistry, name: str, started: float) -> None:
    samples = parse(generate_latest(registry).decode())
    outcomes = {o: value(samples, "delayq_worker_tasks_total", queue=name, outcome=o)
                for o in ("acked", "retried", "dead", "failed")}  # fmt: skip
    assert outcomes == {"acked": 3, "retried": 1, "dead": 1, "failed": 0}
    lateness = value(samples, "delayq_worker_lateness_seconds_count", queue=name)
    assert lateness == 5  # every delivery: 3 + the failing one + the rejected one
    first = value(samples, "delayq_worker_lateness_seconds_bucket", queue=name, le="0.001")
    assert first is not None  # millisecond buckets exist
    for outcome, n in outcomes.items():
        got = value(
            samples, "delayq_worker_handler_duration_seconds_count", queue=name, outcome=outcome
        )
        assert got == n
    assert value(samples, "delayq_worker_end_to_end_seconds_count", queue=name) == 5
    e2e = value(samples, "delayq_worker_end_to_end_seconds_sum", queue=name)
    late = value(samples, "delayq_worker_lateness_seconds_sum", queue=name)
    assert e2e is not None and late is not None and 0 <= e2e < 5 * 10 and late < 5 * 10
    assert value(samples, "delayq_worker_in_progress", queue=name) == 0
    assert value(samples, "delayq_worker_up", queue=name) == 0  # stopped
    beat = value(samples, "delayq_worker_last_heartbeat_timestamp_seconds", queue=name)
    assert beat is not None and beat >= started


def offer_mix() -> list[tuple[dict[str, str], float]]:
    return [({"kind": "ok"}, 0)] * 3 + [({"kind": k}, 0) for k in ("fail", "reject")]


def test_thread_worker_records_lateness_duration_and_outcomes(
    queue: Callable[..., DelayQueue],
) -> None:
    q = queue("work", max_attempts=3)
    registry = CollectorRegistry()
    recorder = WorkerMetrics(registry)
    worker = Worker(q, handle, concurrency=2, handle_signals=False, grace=5, metrics=recorder)
    started = time.time()
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: value(parse(generate_latest(registry).decode()),
                                 "delayq_worker_up", queue="work") == 1)  # fmt: skip
        q.offer_many(offer_mix())
        wait_until(lambda: worker.health().processed >= 5, timeout=10)
        samples = parse(generate_latest(registry).decode())
        assert value(samples, "delayq_worker_up", queue="work") == 1
    finally:
        worker.stop()
        thread.join(10)
    check_worker(registry, "work", started)


async def test_async_worker_records_lateness_duration_and_outcomes(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    q = AsyncDelayQueue("awork", redis7_server.url, prefix=prefix, max_attempts=3)
    registry = CollectorRegistry()
    worker = AsyncWorker(
        q, handle_async, concurrency=2, handle_signals=False, grace=5,
        metrics=WorkerMetrics(registry),
    )  # fmt: skip
    started = time.time()
    running = asyncio.create_task(worker.run())
    try:
        await q.offer_many(offer_mix())
        deadline = time.monotonic() + 10
        while worker.health().processed < 5:
            assert time.monotonic() < deadline, "worker did not process 5 tasks in 10 s"
            await asyncio.sleep(0.01)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
        await q.close()
    check_worker(registry, "awork", started)


def test_a_failure_that_cannot_be_recorded_counts_as_failed(
    queue: Callable[..., DelayQueue],
) -> None:
    q = queue("lost")
    registry = CollectorRegistry()
    worker = Worker(
        q, handle, concurrency=1, handle_signals=False, grace=5, metrics=WorkerMetrics(registry)
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        q.offer({"kind": "lost"}, delay=0)
        wait_until(lambda: worker.health().processed >= 1)
    finally:
        worker.stop()
        thread.join(10)
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "delayq_worker_tasks_total", queue="lost", outcome="failed") == 1
    assert value(samples, "delayq_worker_tasks_total", queue="lost", outcome="retried") == 0


# -- the command line ----------------------------------------------------------------------


def test_cli_without_prometheus_client_fails_with_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now fails
    monkeypatch.delenv("REDIS_URL", raising=False)
    (tmp_path / "handlers.py").write_text("def handle(task):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (["exporter", "--redis", url],
                 ["worker", "handlers:handle", "-q", "q", "--metrics-port", "0",
                  "--redis", url]):  # fmt: skip
        code = main(args)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 1, err
        assert len(lines) == 1 and lines[0].startswith("error: "), err
        assert "pip install 'delayq[metrics]'" in lines[0]


def test_cli_exporter_and_worker_metrics_port_serve_metrics(
    redis7_server: EmbeddedRedis, prefix: str, queue: Callable[..., DelayQueue], tmp_path: Path
) -> None:
    (tmp_path / "handlers.py").write_text("def handle(task):\n    pass\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'src'}"}
    env.pop("REDIS_URL", None)
    target = ["--redis", redis7_server.url, "--prefix", prefix]
    q = queue("cli")
    q.offer_many([({"n": i}, 0) for i in range(3)])
    worker_port, exporter_port = free_port(), free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "delayq.cli", *args, *target],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (
            ["worker", "handlers:handle", "-q", "cli", "--metrics-port", str(worker_port)],
            ["exporter", "--port", str(exporter_port)],
        )
    ]
    try:

        def scraped(port: int, name: str, **labels: str) -> float | None:
            try:
                return value(scrape(f"http://127.0.0.1:{port}/metrics"), name, **labels)
            except OSError:
                return None  # not listening yet

        wait_until(lambda: scraped(worker_port, "delayq_worker_tasks_total",
                                   queue="cli", outcome="acked") == 3, timeout=15)  # fmt: skip
        worker = scrape(f"http://127.0.0.1:{worker_port}/metrics")
        assert value(worker, "delayq_worker_up", queue="cli") == 1
        assert value(worker, "delayq_exporter_up") == 1
        assert value(worker, "delayq_offered_total", queue="cli") == 3  # the queue's gauges too
        assert value(worker, "delayq_worker_lateness_seconds_count", queue="cli") == 3
        wait_until(lambda: scraped(exporter_port, "delayq_acked_total", queue="cli") == 3)
        exported = scrape(f"http://127.0.0.1:{exporter_port}/metrics")
        assert value(exported, "delayq_delivery_lateness_seconds_count", queue="cli") == 3
        assert value(exported, "delayq_tasks", queue="cli", state="ready") == 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=15) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    assert f"serving http://127.0.0.1:{exporter_port}/metrics" in outputs[1][1]

"""One queue class on every layout: one slot, 4 shards, or mid-reshard (4 shards with the
unsharded layout still draining), on a standalone server and on a cluster, through public
calls only. Also the defects of the two-implementation design, each a test."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq import AsyncDelayQueue, DelayQueue, Offer, TaskState, Worker, connect
from delayq._sync.reshard import finish_reshard, reshard
from delayq.embedded import EmbeddedCluster, EmbeddedRedis
from delayq.outbox import Outbox, Relay

from ..conftest import BINARIES
from ..helpers import wait_until
from ..outbox_support import offer_committed, outbox, pending, pg_dsn, table

__all__ = ["outbox", "pg_dsn", "table"]  # fixtures used below

LAYOUTS = ["one-slot", "4-shards", "mid-reshard"]
CLI = [sys.executable, "-m", "delayq.cli"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest, redis7_server: EmbeddedRedis) -> str:
    if request.param == "standalone":
        return redis7_server.url
    cluster: EmbeddedCluster = request.getfixturevalue("cluster")
    return f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_queue(url: str, prefix: str, layout: str) -> Iterator[Callable[..., DelayQueue[Any]]]:
    """Opens queue objects on a queue laid out as ``layout``; the first call creates it (and
    leaves an unsharded task behind for mid-reshard), later ones open it plainly."""
    opened: list[DelayQueue[Any]] = []
    made = False

    def open_(name: str = "orders", **options: Any) -> DelayQueue[Any]:
        nonlocal made
        if not made:
            made = True
            if layout == "4-shards":
                with DelayQueue(name, url, prefix=prefix, shards=4) as creator:
                    creator.offer("creator", delay=3600)
            elif layout == "mid-reshard":
                with DelayQueue(name, url, prefix=prefix) as old:
                    old.offer("old layout", delay=3600, key="old-key")
                reshard(name, url, shards=4, prefix=prefix)
        q: DelayQueue[Any] = DelayQueue(name, url, prefix=prefix, **options)
        opened.append(q)
        return q

    yield open_
    for q in opened:
        q.close()


def _baseline(q: DelayQueue[Any], layout: str) -> int:
    """Tasks the layout's setup left behind (delayed an hour)."""
    return 0 if layout == "one-slot" else 1


def test_every_operation_on_every_layout(
    open_queue: Callable[..., DelayQueue[Any]], layout: str
) -> None:
    producer = open_queue(visibility_timeout=5)
    consumer = open_queue(visibility_timeout=5)  # opened without shards=, like any consumer
    base = _baseline(producer, layout)
    ids = producer.offer_many([(n, 0) for n in range(40)])
    keyed = producer.offer("keyed", delay=60, key="close:7")
    assert producer.offer("again", delay=60, key="close:7") == keyed  # dedup on every layout
    if layout == "mid-reshard":  # a key still live in the old layout stays there
        assert producer.offer("x", delay=60, key="old-key").outcome == "existing"
    mine = producer.offer("by id", delay=60, id="order-1-close")
    assert producer.get(mine) is not None and producer.get(keyed) is not None
    assert producer.reschedule(mine, delay=120)
    assert producer.cancel(mine) and producer.get(mine) is None
    stats = producer.stats()
    assert (stats.ready, stats.delayed) == (40, 1 + base)
    assert len(producer.tasks(TaskState.READY, limit=100)) == 40

    done: set[str] = set()
    rejected = None
    while len(done) < 39 or rejected is None:
        task = consumer.poll(timeout=5)
        assert task is not None, "a consumer opened without shards= sees every task"
        assert task.queue is consumer and task.queue.name == "orders"  # the logical queue
        if task.payload != 13:
            assert task.id not in done
            task.ack()
            done.add(task.id)
        elif task.attempts == 1:
            task.retry(delay=0, error="boom")
        else:  # it came back: to the dead letters, then requeued and finished below
            task.reject("bad")
            rejected = task
    (dead,) = consumer.dead()
    assert dead.id == rejected.id and dead.error == "bad"
    assert producer.requeue_dead() == 1
    with consumer.consume(timeout=1) as tasks:
        for task in tasks:
            assert task.id == rejected.id
    assert done | {rejected.id} == set(ids)
    stats = producer.stats()
    assert (stats.ready, stats.inflight, stats.dead, stats.counters["acked"]) == (0, 0, 0, 40)
    assert producer.purge(["delayed"]) == 1 + base
    assert producer.stats().total == 0
    if layout == "mid-reshard":
        assert (
            finish_reshard("orders", producer._runner, prefix=producer.keys.prefix, grace=0) == "4"
        )


async def test_async_face_on_every_layout(
    open_queue: Callable[..., DelayQueue[Any]], url: str, prefix: str, layout: str
) -> None:
    open_queue().close()  # lays the queue out
    async with AsyncDelayQueue("orders", url, prefix=prefix) as q:
        ids = await q.offer_many([(n, 0) for n in range(20)])
        got = []
        while len(got) < 20:
            batch = await q.poll_many(20, timeout=5)
            assert batch
            assert all(t.queue is q for t in batch)
            assert all(await q.ack_many(batch))
            got += [t.id for t in batch]
        assert sorted(got) == sorted(ids)
        assert (await q.stats()).counters["acked"] == 20


def test_worker_on_every_layout(open_queue: Callable[..., DelayQueue[Any]]) -> None:
    q = open_queue(visibility_timeout=5)
    ids = set(q.offer_many([(n, 0) for n in range(100)]))
    done: Counter[str] = Counter()
    names: set[str] = set()
    lock = threading.Lock()

    def handle(task: Any) -> None:
        with lock:
            done[task.id] += 1
            names.add(task.queue.name)

    worker = Worker(open_queue(), handle, concurrency=4)
    with worker.start_background():
        wait_until(lambda: len(done) == 100, timeout=30)
    assert set(done) == ids and max(done.values()) == 1
    assert names == {"orders"}


def test_cli_on_every_layout(
    open_queue: Callable[..., DelayQueue[Any]], url: str, prefix: str
) -> None:
    q = open_queue(visibility_timeout=5)
    ids = q.offer_many([(n, 0) for n in range(6)])
    for _ in range(6):
        task = q.poll(timeout=5)
        assert task is not None
        task.reject("for the CLI")
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    common = ["--redis", url, "--prefix", prefix]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args, *common], capture_output=True, text=True, env=env, timeout=60
        )

    listed = cli("dead", "orders")
    assert listed.returncode == 0, listed.stderr
    assert all(task_id in listed.stdout for task_id in ids)
    one = cli("requeue", "orders", ids[0])
    assert one.returncode == 0, one.stderr
    every = cli("requeue", "orders", "--all")
    assert every.returncode == 0, every.stderr
    assert "Traceback" not in every.stderr and "AttributeError" not in every.stderr
    assert q.stats().dead == 0 and q.stats().ready == 6
    shown = cli("get", "orders", ids[1])
    assert shown.returncode == 0 and ids[1] in shown.stdout, shown.stderr
    cancelled = cli("cancel", "orders", ids[1])
    assert cancelled.returncode == 0, cancelled.stderr
    assert q.get(ids[1]) is None


def test_a_consumer_opened_before_a_reshard_follows_it(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    url = redis7_server.url
    with (
        DelayQueue("mail", url, prefix=prefix) as producer,
        DelayQueue("mail", url, prefix=prefix, safety_interval=30) as consumer,
    ):
        producer.offer("before", delay=0)
        first = consumer.poll(timeout=5)
        assert first is not None and first.payload == "before"
        first.ack()
        reshard("mail", url, shards=4, prefix=prefix)  # announces it on the old channel
        with DelayQueue("mail", url, prefix=prefix) as new_producer:
            ids = set(new_producer.offer_many([(n, 0) for n in range(8)]))
        got = set()
        while len(got) < 8:
            # Well within the consumer's 30-s safety interval: the announcement moved it.
            task = consumer.poll(timeout=10)
            assert task is not None, "the old consumer follows the new layout"
            got.add(task.id)
            task.ack()
        assert got == ids and consumer.shards == 4


def test_at_most_once_tasks_fetched_ahead_outlive_the_end_of_a_reshard(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    """An at-most-once consumer fetches ahead: those tasks are in no Redis any more, so a
    reshard may be finished under it. They are still handed out after the consumer has read
    the new layout, and what it holds at close() goes back to the new layout (before: the
    first were never handed out, and the rest, put back on the retired sub-queue, were
    refused and lost)."""
    url = redis7_server.url
    with DelayQueue("r", url, prefix=prefix, create=True) as producer:
        producer.offer_many([(n, 0) for n in range(6)])
    reshard("r", url, shards=2, prefix=prefix)  # "r" itself is now the previous layout
    consumer = DelayQueue("r", url, prefix=prefix, ack=False, safety_interval=1)
    try:
        got = [consumer.take().payload, consumer.take().payload]  # a loop: the second
        with DelayQueue("r", url, prefix=prefix) as observer:  # take fetched the rest ahead
            assert observer.stats().total == 0
        finish_reshard("r", url, prefix=prefix, grace=0)  # allowed: "r" holds no task
        time.sleep(1.1)  # the consumer's layout is older than its safety interval now
        third = consumer.poll(timeout=5)  # the layout is read again first
        assert third is not None
        got.append(third.payload)
    finally:
        consumer.close()  # the three it still holds go back, due now
    with DelayQueue("r", url, prefix=prefix) as drainer:
        while (task := drainer.poll(timeout=2)) is not None:
            got.append(task.payload)
            task.ack()
    assert sorted(got) == list(range(6))


def test_a_reshard_to_a_close_count_counts_each_task_once(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    """4 and 5 shards of a queue share a sub-queue: while the reshard runs, the queue's and
    the handle's stats count its tasks once (before: twice)."""
    url = redis7_server.url
    with DelayQueue("promo", url, prefix=prefix, shards=4) as q:
        q.offer_many([(n, 60) for n in range(400)])
    reshard("promo", url, shards=5, prefix=prefix)
    with DelayQueue("promo", url, prefix=prefix) as q, connect(url, prefix=prefix) as conn:
        assert q.stats().total == 400
        (stats,) = conn.stats(["promo"])
        assert stats.total == 400


def test_a_task_points_at_the_logical_queue(redis7_server: EmbeddedRedis, prefix: str) -> None:
    with DelayQueue("orders", redis7_server.url, prefix=prefix, shards=4) as q:
        q.offer_many([Offer(n, 0, key=f"k{n}") for n in range(8)])
        names = {q.poll(timeout=5).queue.name for _ in range(8)}  # type: ignore[union-attr]
        assert names == {"orders"}


def test_a_consumer_of_an_unknown_queue_says_so(
    redis7_server: EmbeddedRedis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis7_server.url
    with DelayQueue("orders", url, prefix=prefix) as real:
        real.offer("x", delay=60)
    with caplog.at_level(logging.WARNING, logger="delayq"):
        with DelayQueue("ordres", url, prefix=prefix) as typo:
            assert typo.poll(timeout=0) is None
            assert typo.known is False
        with DelayQueue("brand-new", url, prefix=prefix, create=True) as new:
            assert new.poll(timeout=0) is None
            assert new.known is True
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("'ordres' is unknown" in w and "Did you mean 'orders'" in w for w in warnings)
    assert not any("brand-new" in w for w in warnings)


def test_a_worker_on_an_unknown_queue_says_so_in_its_health(
    redis7_server: EmbeddedRedis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis7_server.url
    with DelayQueue("orders", url, prefix=prefix) as real:
        real.offer("x", delay=60)
    with (
        caplog.at_level(logging.WARNING, logger="delayq"),
        DelayQueue("ordres", url, prefix=prefix) as typo,
    ):
        worker = Worker(typo, lambda task: None)
        with worker.start_background():
            wait_until(lambda: worker.health().unknown_queues == ("ordres",), timeout=10)
            assert worker.health().alive
    assert any("Did you mean 'orders'" in r.getMessage() for r in caplog.records)


def test_the_relay_feeds_a_sharded_queue(
    outbox: Outbox, pg_dsn: str, table: str, redis_url: str, prefix: str
) -> None:
    """Rows for a sharded queue become tasks on their shards (the key's shard for a keyed
    one, so dedup holds), found by id; nothing stays pending."""
    with DelayQueue("orders", redis_url, prefix=prefix, shards=4) as q:
        q.stats()  # lays the queue out in Redis
        ids = offer_committed(outbox, pg_dsn, 12)
        keyed = offer_committed(outbox, pg_dsn, 2, key="close:1")
        assert pending(pg_dsn, table) == 14
        assert Relay(pg_dsn, redis_url, table=table).relay_pending() == 14
        assert pending(pg_dsn, table) == 0
        assert all(q.get(task_id) is not None for task_id in ids)
        assert q.get(keyed[0]) is not None and q.get(keyed[1]) is None  # one task per key
        stats = q.stats()
        assert stats.delayed == 13 and sum(1 for s in stats.shards if s.delayed) > 1


@pytest.mark.parametrize("create", [False, True])
def test_the_worker_command_on_a_misspelt_queue_says_so(
    redis7_server: EmbeddedRedis, prefix: str, tmp_path: Path, create: bool
) -> None:
    """`delayq worker app:h --queue ordres` names the queue it cannot see at once, with the
    one meant; `--create` says nothing."""
    with DelayQueue("orders", redis7_server.url, prefix=prefix) as real:
        real.offer("x", delay=60)
    (tmp_path / "handlers_typo.py").write_text("def handle(task):\n    pass\n")
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    command = [*CLI, "worker", "handlers_typo:handle", "-q", "ordres", "--redis"]
    command += [redis7_server.url, "--prefix", prefix, *(["--create"] if create else [])]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        if create:  # the first look registers the queue: by then a warning would be out
            with DelayQueue("ordres", redis7_server.url, prefix=prefix) as probe:
                wait_until(lambda: probe.poll(timeout=0) is None and probe.known, timeout=15)
            wait_until(lambda: any("worker started" in line for line in lines), timeout=15)
        else:
            wait_until(lambda: any("Did you mean" in line for line in lines), timeout=15)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        reader.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        proc.stdout.close()
    out = "".join(lines)
    warned = "'ordres' is unknown" in out and "Did you mean 'orders'" in out
    assert warned is not create, out


def test_three_sharded_queues_on_one_client_hold_one_pubsub_connection(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    """A worker on three 8-shard queues sharing one client: 24 channels, one pub/sub
    connection to the server (not one per queue and shard)."""
    import redis as redis_lib

    name = f"engine-{prefix}"  # this test's connections, among any others on the server
    client = redis_lib.Redis.from_url(redis7_server.url, client_name=name)
    admin = redis_lib.Redis.from_url(redis7_server.url)
    queues = [DelayQueue(f"q{i}", client, prefix=prefix, shards=8) for i in range(3)]
    done: Counter[str] = Counter()
    try:
        for q in queues:
            q.offer_many([(n, 0) for n in range(10)])
        worker = Worker(queues, lambda task: done.update([task.queue.name]))
        with worker.start_background():
            wait_until(lambda: sum(done.values()) == 30, timeout=20)
            pubsub = [c for c in admin.client_list(_type="pubsub") if c["name"] == name]
            assert len(pubsub) == 1, pubsub
    finally:
        for q in queues:
            q.close()
        client.close()
        admin.close()
    assert done == Counter({"q0": 10, "q1": 10, "q2": 10})


async def test_exporter_and_dashboard_on_every_layout(
    open_queue: Callable[..., DelayQueue[Any]], url: str, prefix: str, layout: str
) -> None:
    import httpx

    from delayq.dashboard import Settings, create_app
    from delayq.metrics import QueueCollector

    q = open_queue()
    q.offer_many([(n, 60) for n in range(10)])
    expected = 10 + _baseline(q, layout)
    collector = QueueCollector(url, prefix=prefix)
    try:
        by_name = {s.queue: s for s in collector.read()}
    finally:
        collector.close()
    assert by_name["orders"].delayed == expected
    app = create_app(Settings(redis_url=url, prefix=prefix))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    try:
        index = await client.get("/")
        assert index.status_code == 200, index.text
        row = index.text[index.text.index('data-queue="orders"') :]
        assert f'data-field="delayed">{expected}<' in row[: row.index("</tr>")]
        page = await client.get("/q/orders")
        assert page.status_code == 200, page.text
    finally:
        await client.aclose()
        await app.state.dashboard.monitor.close()


def test_an_idle_consumer_of_a_sharded_queue_looks_once_per_safety_interval(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    """Not once per shard: the shards' safety looks are spread over shards x the interval."""
    import redis as redis_lib

    admin = redis_lib.Redis.from_url(redis7_server.url)
    with DelayQueue("sleepy", redis7_server.url, prefix=prefix, shards=8, safety_interval=0.5) as q:
        q.offer("later", delay=3600)
        assert q.poll(timeout=0) is None  # the first look: every shard
        before = admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        assert q.poll(timeout=4.0) is None
        looks = admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0) - before
    admin.close()
    # 8 shards looked at every 4 s: about 8 looks in the 4 s (one per half second), not 64.
    assert looks <= 20, f"{looks} script calls in 4 s of idling on 8 shards"

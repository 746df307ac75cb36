"""The plain fetch and ack: a queue without a pause, limits, histories or schedules runs the
fetch and the ack without those features' functions; a queue that has one is refused by
them, untouched, and served by the full scripts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq import DelayQueue, Limit
from delayq._core import protocol
from delayq._core.scripts import PLAIN, Op, script
from delayq._sync import shard as shard_module

from ..helpers import wait_until

FEATURES: dict[str, Callable[[DelayQueue], Any]] = {
    "pause": lambda q: q.pause(),
    "limit": lambda q: q.limits.set("tenant", Limit(concurrency=1)),
    "history": lambda q: q.enable_history(60),
    "schedule": lambda q: q.schedules.upsert("nightly", "x", every=3600),
}


def loaded(client: redis.Redis, op: Op) -> bool:
    return bool(client.script_exists(script(op).sha)[0])


def take_and_ack(q: DelayQueue) -> None:
    q.offer("x", delay=0)
    task = q.poll(timeout=5)
    assert task is not None
    q.ack(task)


@pytest.fixture
def fresh_scripts(client: redis.Redis) -> Iterator[None]:
    """The server's script cache emptied (its own, started for the tests), so that what is
    loaded afterwards shows which scripts a queue sent."""
    client.script_flush()
    yield


def test_a_queue_without_features_sends_only_the_plain_scripts(
    make_queue: Callable[..., DelayQueue], client: redis.Redis, fresh_scripts: None
) -> None:
    q = make_queue(fetch_ahead=0)  # an ack is its own call, not the next fetch's
    for _ in range(3):
        take_and_ack(q)
    assert loaded(client, Op.FETCH_PLAIN) and loaded(client, Op.ACK_PLAIN)
    assert not loaded(client, Op.FETCH) and not loaded(client, Op.ACK)


@pytest.mark.parametrize("feature", FEATURES)
def test_the_plain_scripts_refuse_a_queue_with_a_feature_and_write_nothing(
    make_queue: Callable[..., DelayQueue], client: redis.Redis, feature: str
) -> None:
    q = make_queue(f"refused-{feature}")
    leased_id = q.offer("leased", delay=0)
    task = q.poll(timeout=5)
    assert task is not None and task.id == leased_id and task.lease_token is not None
    due_id = q.offer("due", delay=0)
    FEATURES[feature](q)
    shard = q._all()[0]
    keys = list(shard.keys.all)
    before = {k: client.dump(k) for k in client.scan_iter(f"{shard.keys.prefix}:*")}
    policy = protocol.Policy(30_000, 5, q._policy.backoff)
    args = protocol.fetch_args(policy, 10, 15_000)
    fetch_receipt = shard.keys.receipt("fetch", args[2])
    ack_receipt = shard.keys.receipt("ack", "n1")
    plain_fetch = script(PLAIN[Op.FETCH])
    plain_ack = script(PLAIN[Op.ACK])
    for plain in (plain_fetch, plain_ack):  # this test may be the server's first to send them
        client.script_load(plain.source)
    features = shard.keys.features
    assert client.evalsha(plain_fetch.sha, 24, *keys, fetch_receipt, *features, *args) is None
    ack_args = (15_000, task.id, task.lease_token)
    assert client.evalsha(plain_ack.sha, 24, *keys, ack_receipt, *features, *ack_args) is None
    after = {k: client.dump(k) for k in client.scan_iter(f"{shard.keys.prefix}:*")}
    assert after == before  # nothing written, no receipt kept
    assert q.get(due_id) is not None


def test_a_feature_switched_on_under_a_plain_consumer_takes_effect(
    make_queue: Callable[..., DelayQueue],
) -> None:
    consumer = make_queue("switched")
    admin = make_queue("switched")
    take_and_ack(consumer)  # the consumer runs plain
    admin.pause()
    admin.offer("held", delay=0)
    assert consumer.poll(timeout=0.3) is None  # the full fetch sees the pause
    admin.resume()
    task = consumer.poll(timeout=5)
    assert task is not None and task.payload == "held"
    admin.enable_history(60)
    consumer.ack(task)
    kinds = [event.kind for event in admin.history(task.id)]
    assert kinds[-1] == "acked", kinds  # the full ack recorded it


def test_the_plain_scripts_come_back_when_the_features_go(
    make_queue: Callable[..., DelayQueue],
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shard_module, "FULL_HOLD_S", 0.5)
    q = make_queue("back", fetch_ahead=0)
    q.pause()
    assert q.poll() is None
    assert q._all()[0].variant(Op.FETCH) is Op.FETCH  # refused: full for a while
    q.resume()
    wait_until(lambda: q._all()[0].variant(Op.FETCH) is Op.FETCH_PLAIN, timeout=5)
    client.script_flush()
    take_and_ack(q)
    assert loaded(client, Op.FETCH_PLAIN) and loaded(client, Op.ACK_PLAIN)


def test_acks_across_shards_fall_back_when_refused(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("spread", shards=4)
    for i in range(40):
        q.offer(f"t{i}", delay=0)
    tasks: list[Any] = []
    while len(tasks) < 40:
        got = q.poll_many(40 - len(tasks), timeout=5)
        assert got, "the offered tasks did not come"
        tasks += got
    assert len({q._shard_of(t) for t in tasks}) > 1  # spread: one round trip per node
    q.enable_history(60)  # after the fetch: the plain acks are refused on every shard
    assert q.ack_many(tasks) == [True] * len(tasks)
    assert q.stats().inflight == 0
    for task in tasks[:5]:
        assert [e.kind for e in q.history(task.id)][-1:] == ["acked"]

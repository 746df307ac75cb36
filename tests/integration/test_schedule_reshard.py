"""Recurring schedules across a reshard (issue #19): the reshard carries each schedule to the
shard its name maps to in the new layout, with its cursor, version and counters, so that no
fire time runs twice and none is lost; after ``--finish`` it goes on firing where consumers
read. Short periods (1 s) with generous bounds; each wait is on a condition."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import redis

from delayq import ConfigError, DelayQueue, Task
from delayq._core import sharding
from delayq._sync.reshard import finish_reshard, reshard
from tests.helpers import wait_until

from .test_schedules import fire_ms, nudge, take_fires

Make = Callable[..., DelayQueue]


def finish_when_drained(name: str, url: str, prefix: str, q: DelayQueue) -> list[Task]:
    """finish_reshard, retried while the old layout still holds tasks (fires made there before
    the move drain at their times); consumers keep taking and acking meanwhile: the fires
    taken on the way."""
    seen: list[Task] = []

    def attempt() -> str | None:
        task = q.poll(timeout=0.2)
        if task is not None:
            seen.append(task)
            task.ack()
        try:
            return finish_reshard(name, url, prefix=prefix, grace=0)
        except ConfigError as exc:
            assert "still in the previous layout" in str(exc), exc
            return None

    wait_until(attempt, timeout=20)
    return seen


def schedule_home(q: DelayQueue, name: str, shards: int) -> str:
    subs = sharding.shard_names(q.name, shards)
    return subs[sharding.shard_of(name, shards)]


def state_of(client: redis.Redis, prefix: str, sub: str, name: str) -> dict[str, str]:
    raw = client.hgetall(f"{prefix}:{{{sub}}}:sched:st:{name}")
    return {k.decode(): v.decode(errors="replace") for k, v in raw.items()}


def no_time_twice_none_lost(fires: list[Task], missed: int) -> list[int]:
    times = sorted(fire_ms(t) for t in fires)
    counted = Counter(times)
    assert max(counted.values()) == 1, f"a time fired twice: {counted.most_common(2)}"
    span = (times[-1] - times[0]) // 1000 + 1
    assert len(times) + missed >= span, f"{span - len(times)} time(s) lost, {missed} missed"
    return times


def test_an_unsharded_queues_schedule_moves_and_fires_after_finish(
    make_queue: Make, redis_server, prefix: str, client: redis.Redis
) -> None:
    q = make_queue("beat", visibility_timeout=5, safety_interval=0.2)
    q.schedules.upsert("tick", {"n": 1}, every=1)
    before = take_fires(q, 2)
    old = q.schedules.get("tick")
    assert old is not None
    assert reshard("beat", redis_server.url, shards=3, prefix=prefix) == "3<0"
    moved = q.schedules.get("tick")
    assert moved is not None, "the schedule is found in the new layout"
    assert moved.version == old.version and moved.fired >= old.fired
    home = schedule_home(q, "tick", 3)
    assert state_of(client, prefix, home, "tick").get("gone") == "0"
    assert state_of(client, prefix, "beat", "tick").get("gone") == "1", "a tombstone stays"
    during = take_fires(q, 2)
    drained = finish_when_drained("beat", redis_server.url, prefix, q)
    assert client.hget(f"{prefix}:shards", "beat") == b"3"
    after = take_fires(q, 2)
    info = q.schedules.get("tick")
    assert info is not None
    times = no_time_twice_none_lost([*before, *during, *drained, *after], info.missed)
    assert times[-1] > fire_ms(during[-1])
    assert all(t.schedule == "tick" and t.payload == {"n": 1} for t in after)


def test_sharded_to_fewer_shards_carries_cron_times_and_every_schedule(
    make_queue: Make, redis_server, prefix: str, client: redis.Redis
) -> None:
    """4 shards -> 2 -> 1: each schedule lands on the shard its name maps to, its cron times
    ahead with it; the series go on with no time twice."""
    q = make_queue("promo", shards=4, visibility_timeout=5)
    names = ["a", "b", "c", "d", "e"]
    for name in names:
        q.schedules.upsert(name, name, every=1, overlap="allow_all")
    q.schedules.upsert("cron", "c", cron="* * * * * *", overlap="allow_all")
    fires = take_fires(q, 12)
    for shards, expected in ((2, "2<4"), (1, "1<2")):
        versions = {i.name: i.version for i in q.schedules.list()}
        assert reshard("promo", redis_server.url, shards=shards, prefix=prefix) == expected
        for name in [*names, "cron"]:
            home = schedule_home(q, name, shards)
            assert state_of(client, prefix, home, name).get("gone") == "0", (name, home)
        at_key = f"{prefix}:{{{schedule_home(q, 'cron', shards)}}}:sched:at:cron"
        assert client.zcard(at_key) >= 8, "the cron times ahead came along (or were topped up)"
        assert {i.name: i.version for i in q.schedules.list()} == versions
        fires += take_fires(q, 12)
        fires += finish_when_drained("promo", redis_server.url, prefix, q)
    fires += take_fires(q, 12)
    for name in [*names, "cron"]:
        info = q.schedules.get(name)
        assert info is not None
        no_time_twice_none_lost([t for t in fires if t.schedule == name], info.missed)


def test_an_interrupted_move_is_finished_by_the_same_reshard_again(
    make_queue: Make, redis_server, prefix: str, client: redis.Redis, monkeypatch
) -> None:
    """The connection drops between taking a schedule off the old shard and landing it: it
    is live nowhere (never on both), and the same reshard run again lands it with its cursor
    and counters. Another shard count is still refused meanwhile."""
    from delayq._sync import schedule_moves

    q = make_queue("beat", visibility_timeout=5)
    q.schedules.upsert("tick", "t", every=1)
    before = take_fires(q, 2)
    taken = q.schedules.get("tick")
    assert taken is not None
    landing = schedule_moves.land_args

    def cut(*args: object) -> object:
        raise ConnectionError("cut between take and land")

    monkeypatch.setattr(schedule_moves, "land_args", cut)
    with pytest.raises(ConnectionError):
        reshard("beat", redis_server.url, shards=2, prefix=prefix)
    old = state_of(client, prefix, "beat", "tick")
    assert old["gone"] == "1" and old["mv"] == schedule_home(q, "tick", 2)
    assert state_of(client, prefix, schedule_home(q, "tick", 2), "tick") == {}
    with pytest.raises(ConfigError, match="already being resharded"):
        reshard("beat", redis_server.url, shards=3, prefix=prefix)
    monkeypatch.setattr(schedule_moves, "land_args", landing)
    assert reshard("beat", redis_server.url, shards=2, prefix=prefix) == "2<0"
    assert reshard("beat", redis_server.url, shards=2, prefix=prefix) == "2<0", "a no-op now"
    landed = q.schedules.get("tick")
    assert landed is not None and landed.version == taken.version
    assert landed.fired >= taken.fired and landed.last_fire == taken.last_fire
    after = take_fires(q, 2)
    info = q.schedules.get("tick")
    assert info is not None
    no_time_twice_none_lost([*before, *after], info.missed)


def test_a_process_with_the_old_layout_is_sent_to_the_new_one(
    make_queue: Make, redis_server, prefix: str, client: redis.Redis
) -> None:
    """A queue object that has not re-read the layout (a long safety interval, no consumer
    listening) reads, edits and creates schedules on the new layout: the old shard's
    tombstone and its 'away' mark answer MOVED, and the call follows."""
    stale = make_queue("beat", safety_interval=3600)
    stale.schedules.upsert("tick", "t", every=60)
    assert stale.schedules.get("tick") is not None  # the layout read: unsharded
    reshard("beat", redis_server.url, shards=2, prefix=prefix)
    info = stale.schedules.get("tick")
    assert info is not None and info.version == 1
    assert stale.schedules.upsert("tick", "t2", every=60).version == 2
    stale2 = make_queue("beat", safety_interval=3600)
    assert stale2.schedules.list()  # reads the layout during the reshard
    created = make_queue("beat", safety_interval=3600)
    created._routes()  # the layout as of now (during the reshard)
    assert created.schedules.upsert("fresh", "f", every=60).version == 1
    for name in ("tick", "fresh"):
        assert state_of(client, prefix, schedule_home(stale, name, 2), name)["gone"] == "0"
    assert state_of(client, prefix, "beat", "fresh") == {}, "nothing created on the old side"
    assert state_of(client, prefix, "beat", "tick")["gone"] == "1"
    assert stale.schedules.pause("tick") and stale.schedules.resume("tick")


def test_overlap_counts_a_fire_still_running_on_the_old_shard(
    make_queue: Make, redis_server, prefix: str
) -> None:
    """overlap="skip": a fire taken before the reshard and not yet acked keeps the moved
    schedule's next fires skipped; once it is acked on the old shard, the schedule sees it
    end (within a second or so) and fires again."""
    q = make_queue("beat", visibility_timeout=30)
    q.schedules.upsert("slow", "s", every=1)
    (running,) = take_fires(q, 1, ack=False)
    reshard("beat", redis_server.url, shards=2, prefix=prefix)
    moved = q.schedules.get("slow")
    assert moved is not None and moved.running == 1
    skipped_at_move = moved.skipped
    wait_until(lambda: nudge(q) and q.schedules.get("slow").skipped >= skipped_at_move + 2)
    assert q.poll(timeout=0) is None, "nothing fired while the old fire runs"
    running.ack()
    (nxt,) = take_fires(q, 1)
    assert fire_ms(nxt) > fire_ms(running)
    info = q.schedules.get("slow")
    assert info is not None and info.running == 0 and info.last_outcome == "ok"


def test_a_held_fire_is_carried_and_released_when_the_old_one_ends(
    make_queue: Make, redis_server, prefix: str
) -> None:
    """overlap="buffer_one", every 2 s: the next fire is made 1 s ahead and held while the
    first runs; the reshard carries it, and it runs (at its time, not before) once the first
    ends on the old shard. Not carried, nothing would run before the time after it."""
    q = make_queue("beat", visibility_timeout=30)
    q.schedules.upsert("slow", "s", every=2, overlap="buffer_one")
    (running,) = take_fires(q, 1, ack=False)
    wait_until(lambda: nudge(q) and q.schedules.get("slow").fired >= 2)  # one held back
    reshard("beat", redis_server.url, shards=3, prefix=prefix)
    assert q.poll(timeout=0.2) is None, "the held fire waits for the running one"
    running.ack()
    (released,) = take_fires(q, 1, ack=False)
    assert fire_ms(released) == fire_ms(running) + 2000, "the held fire, carried"
    assert released.delivered_ms >= fire_ms(released), "never early"
    assert q.schedules.get("slow").running == 1
    released.ack()


def test_requests_and_tombstones_come_along(make_queue: Make, redis_server, prefix: str) -> None:
    """A trigger retried after the reshard is still a no-op; a schedule removed before it is
    re-created after it from its tombstone (next version, after its last fire)."""
    q = make_queue("beat", visibility_timeout=5)
    q.schedules.upsert("report", "r", every=3600)
    first = q.schedules.trigger("report", request="rerun-1")
    q.schedules.upsert("gone", "g", every=1)
    (last,) = take_fires(q, 2)[-1:]
    assert last.schedule in ("gone", "report")
    gone = q.schedules.get("gone")
    assert gone is not None and q.schedules.remove("gone")
    assert reshard("beat", redis_server.url, shards=2, prefix=prefix) == "2<0"
    assert q.schedules.trigger("report", request="rerun-1") == first
    assert q.schedules.get("report").manual == 1
    again = q.schedules.upsert("gone", "g", every=1)
    assert again.version == gone.version + 1
    assert again.last_fire is not None and gone.last_fire is not None
    assert again.next_fire is not None and again.next_fire > gone.last_fire


def test_a_sub_queue_both_layouts_share_stays_current(
    make_queue: Make, redis_server, prefix: str, client: redis.Redis
) -> None:
    """4 and 5 shards of "promo" both name promo~0.3: the finish neither waits for it nor
    retires it (offers routed there kept failing with LAYOUT_RETIRED), and the schedules on
    it whose home changed move while the one whose home it stays is left in place."""
    shared = "promo~0.3"
    assert shared in sharding.shard_names("promo", 4) and shared in sharding.shard_names("promo", 5)
    on_shared = [n for n in (f"s{i}" for i in range(40)) if schedule_home_of(n, 4) == shared]
    moving = next(n for n in on_shared if schedule_home_of(n, 5) != shared)
    staying = next(n for n in on_shared if schedule_home_of(n, 5) == shared)
    q = make_queue("promo", shards=4, visibility_timeout=5)
    for name in (moving, staying):
        q.schedules.upsert(name, name, every=1, overlap="allow_all")
    fires = take_fires(q, 4)
    reshard("promo", redis_server.url, shards=5, prefix=prefix)
    assert state_of(client, prefix, shared, moving)["gone"] == "1"
    assert state_of(client, prefix, schedule_home_of(moving, 5), moving)["gone"] == "0"
    assert state_of(client, prefix, shared, staying)["gone"] == "0"
    fires += take_fires(q, 4)
    fires += finish_when_drained("promo", redis_server.url, prefix, q)
    assert client.hget(f"{prefix}:{{{shared}}}:counters", "retired") is None
    ids = [q.offer(n) for n in range(40)]  # some go to the shared sub-queue
    assert len(set(ids)) == 40
    fires += take_fires(q, 40 + 4)
    for name in (moving, staying):
        info = q.schedules.get(name)
        assert info is not None
        no_time_twice_none_lost([t for t in fires if t.schedule == name], info.missed)


def schedule_home_of(name: str, shards: int) -> str:
    return sharding.shard_names("promo", shards)[sharding.shard_of(name, shards)]


async def test_the_asyncio_front_end_carries_and_follows(
    make_async_queue, redis_server, prefix: str, client: redis.Redis
) -> None:
    from delayq._async import reshard as resharding

    q = make_async_queue("beat", safety_interval=3600)
    await q.schedules.upsert("tick", "t", every=60)
    await q.schedules.upsert("nightly", "n", cron="0 3 * * *", tz="Europe/London")
    started = await resharding.start_reshard("beat", redis_server.url, shards=2, prefix=prefix)
    assert started == ("2<0", 2)
    assert (await q.schedules.get("tick")) is not None  # a stale layout, sent on
    assert [i.name for i in await q.schedules.list()] == ["nightly", "tick"]
    home = schedule_home(q, "nightly", 2)
    assert client.zcard(f"{prefix}:{{{home}}}:sched:at:nightly") >= 16
    await q.schedules.pause("nightly")
    assert (await q.schedules.get("nightly")).paused

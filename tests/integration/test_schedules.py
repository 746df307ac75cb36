"""Recurring schedules against real Redis (issue #19): exactly once per fire time, the chain
surviving cancelled, dead-lettered and purged fires, catch-up and overlap policies, edits,
remove and re-create, pause/resume/trigger/backfill, cron times topped up by the fetch
signal, sharded queues. Short periods (1-2 s) with generous bounds; no sleep-and-hope: each
wait is on a condition with a timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from delayq import ConfigError, DelayQueue, ScheduleNotFound, Task
from tests.helpers import wait_until

Make = Callable[..., DelayQueue]
ZONE_NY = ZoneInfo("America/New_York")


def take_fires(q: DelayQueue, count: int, timeout: float = 15.0, ack: bool = True) -> list[Task]:
    """Take ``count`` tasks (failing after ``timeout``), acking each unless told not to."""
    got: list[Task] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(got)} of {count} fires within {timeout}s"
        task = q.poll(timeout=min(left, 1.0))
        if task is not None:
            got.append(task)
            if ack:
                task.ack()
    return got


def nudge(q: DelayQueue) -> bool:
    """One look that takes nothing, as an idle consumer's would: the schedule step runs (the
    chain advances only in fetch's housekeeping). Returns True, for use in wait_until."""
    for shard in q._routes().every:
        q._fetch(q._watch(shard), 0)
    return True


def nudged(q: DelayQueue, check: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: nudge(q) and check()


def fire_ms(task: Task) -> int:
    assert task.fire_time is not None
    return round(task.fire_time.timestamp() * 1000)


def state(client: redis.Redis, q: DelayQueue, name: str) -> dict[str, str]:
    raw = client.hgetall(f"{q.keys.prefix}:{{{q.name}}}:sched:st:{name}")
    return {k.decode(): v.decode(errors="replace") for k, v in raw.items()}


# -- firing ---------------------------------------------------------------------------------


def test_every_fires_once_per_time_on_time_with_its_name_and_time(make_queue: Make) -> None:
    q = make_queue()
    info = q.schedules.upsert("tick", {"job": "tick"}, every=1)
    assert info.version == 1 and info.changed is True and info.next_fire is not None
    fires = take_fires(q, 3)
    times = [fire_ms(t) for t in fires]
    assert all(ms % 1000 == 0 for ms in times), "every=1 is aligned to whole seconds"
    assert times == [times[0] + 1000 * k for k in range(3)], "consecutive, none twice"
    for t in fires:
        assert t.schedule == "tick" and t.payload == {"job": "tick"}
        assert t.id == f"s:tick:{fire_ms(t)}"
        assert t.delivered_ms >= fire_ms(t), "a fire is never early"
        assert t.lateness_ms < 1000, "generous bound: the machine is shared"
    got = q.schedules.get("tick")
    assert got is not None and got.fired >= 3 and got.last_outcome == "ok"
    assert got.last_success is not None and got.missed == 0


def test_plain_tasks_have_no_schedule(make_queue: Make) -> None:
    q = make_queue()
    q.offer("plain")
    (task,) = take_fires(q, 1)
    assert task.schedule is None and task.fire_time is None


def test_cron_with_seconds_fires_and_times_are_topped_up(
    make_queue: Make, client: redis.Redis
) -> None:
    """A per-second cron keeps times ahead; when someone removes most of them (as if they
    ran out), the next fetch signals it and the consumer writes more: the chain goes on."""
    q = make_queue()
    info = q.schedules.upsert("cron", "c", cron="* * * * * *")
    assert len(info.next_fires) == 5
    at_key = f"{q.keys.prefix}:{{{q.name}}}:sched:at:cron"
    assert client.zcard(at_key) >= 16
    first = take_fires(q, 2)
    client.zremrangebyrank(at_key, 1, -1)  # one time left: short
    more = take_fires(q, 3)
    times = [fire_ms(t) for t in first + more]
    assert times == sorted(set(times)), "none twice"
    assert times[-1] - times[0] == 1000 * (len(times) - 1), "none missing"
    assert client.zcard(at_key) >= 8, "the fetch signal got times written"
    client.delete(at_key)  # starved: the step asks again each second until refilled
    later = take_fires(q, 2, timeout=20)
    assert fire_ms(later[0]) > times[-1]


def test_same_spec_from_many_upserts_is_one_schedule(make_queue: Make) -> None:
    q = make_queue()
    results: list[Any] = []

    def upsert() -> None:
        with make_queue() as mine:
            results.append(mine.schedules.upsert("boot", {"v": 1}, every=2))

    threads = [threading.Thread(target=upsert) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 20
    assert sum(1 for r in results if r.changed) == 1, "the first created it, the rest no-ops"
    assert {r.version for r in results} == {1}
    changed = q.schedules.upsert("boot", {"v": 2}, every=2)
    assert changed.changed and changed.version == 2
    (task,) = take_fires(q, 1)
    assert task.payload == {"v": 2}


# -- the chain goes on, whatever happens to a fire ---------------------------------------------


def test_cancelled_dead_lettered_and_purged_fires_do_not_break_the_chain(
    make_queue: Make,
) -> None:
    q = make_queue(max_attempts=1)
    q.schedules.upsert("chain", "x", every=1, overlap="allow_all")
    waiting = wait_until(nudged(q, lambda: q.tasks("ready")), timeout=10)[0]  # not taken
    assert q.cancel(waiting.id)
    dead = take_fires(q, 1, ack=False)[0]
    dead.reject("boom")
    assert q.purge("dead") == 1
    rest = take_fires(q, 2)
    times = [int(waiting.id.rsplit(":", 1)[1]), fire_ms(dead), *map(fire_ms, rest)]
    assert times == sorted(set(times)), "each time once, in order"
    info = q.schedules.get("chain")
    assert info is not None and info.running == 0


def test_a_fire_time_is_refused_forever_after_its_task_is_gone(
    make_queue: Make, client: redis.Redis
) -> None:
    """The cursor, not a task record, decides: rewinding the wake plan to an old time (as a
    lagging process would) fires nothing old again, even after the fire was acked."""
    q = make_queue()
    q.schedules.upsert("once", "x", every=1)
    (task,) = take_fires(q, 1)
    old = fire_ms(task)
    due_key = f"{q.keys.prefix}:{{{q.name}}}:sched:due"
    client.zadd(due_key, {"once": old - 5000})
    nxt = take_fires(q, 1)[0]
    assert fire_ms(nxt) > old


# -- catch-up after downtime ------------------------------------------------------------------


def test_each_catchup_policy_after_downtime_with_counts(make_queue: Make) -> None:
    """Every consumer down for several periods (nobody fetches), then one look 1.2-1.8 s after
    a fire time: "latest" runs that one late fire, "all" every missed one, "skip" none (later
    than its 1 s grace); the rest are counted missed."""
    q = make_queue()
    for policy in ("latest", "all", "skip"):
        q.schedules.upsert(policy, policy, every=3, catchup=policy, overlap="allow_all")
    time.sleep(9)  # the downtime itself (three periods), not a wait for a condition
    wait_until(lambda: 1.2 <= time.time() % 3 <= 1.8, timeout=5, interval=0.005)
    nudge(q)  # the first look after the downtime runs every schedule's step
    fires: list[Task] = []
    while (task := q.poll(timeout=0)) is not None:
        fires.append(task)
        task.ack()
    by_policy = {p: [t for t in fires if t.schedule == p] for p in ("latest", "all", "skip")}
    infos = {i.name: i for i in q.schedules.list()}
    assert len(by_policy["latest"]) == 1, "one late fire runs"
    assert infos["latest"].missed >= 2
    assert len(by_policy["all"]) >= 3, "every missed time is replayed"
    assert [fire_ms(t) for t in by_policy["all"]] == sorted({fire_ms(t) for t in by_policy["all"]})
    assert infos["all"].missed == 0
    assert by_policy["skip"] == [], "no late fire"
    assert infos["skip"].missed >= 3
    for name, info in infos.items():
        assert info.fired + info.missed == len(by_policy["all"]), name


def test_catchup_window_drops_a_fire_that_waits_too_long(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("window", "w", every=2, catchup_window=0.5, overlap="allow_all")
    wait_until(nudged(q, lambda: q.stats().ready >= 1), timeout=10)  # offered, not taken
    wait_until(nudged(q, lambda: (q.schedules.get("window") or _never()).missed), timeout=10)
    assert q.stats().counters.get("expired", 0) >= 1
    info = q.schedules.get("window")
    assert info is not None and info.last_outcome in ("expired", "missed")


def _never() -> Any:
    raise AssertionError("schedule vanished")


# -- overlap ------------------------------------------------------------------------------------


def test_overlap_skip_while_a_fire_runs(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("slow", "s", every=1)
    (running,) = take_fires(q, 1, ack=False)
    wait_until(nudged(q, lambda: (q.schedules.get("slow") or _never()).skipped >= 2), timeout=10)
    assert q.poll(timeout=0) is None, "no fire while one runs"
    running.ack()
    (nxt,) = take_fires(q, 1)
    assert fire_ms(nxt) > fire_ms(running) + 2000


def test_overlap_buffer_one_keeps_the_newest_and_runs_it_after(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("buf", "b", every=1, overlap="buffer_one")
    (running,) = take_fires(q, 1, ack=False)
    wait_until(nudged(q, lambda: (q.schedules.get("buf") or _never()).skipped >= 1), timeout=10)
    assert q.poll(timeout=0) is None, "held back while one runs"
    running.ack()
    (held,) = take_fires(q, 1, timeout=3, ack=False)
    assert fire_ms(held) > fire_ms(running) + 1000
    assert held.lateness_ms < 1000, "released by the ack, at once"


def test_a_held_fire_released_before_its_time_waits_for_it(make_queue: Make) -> None:
    """A fire is made up to 1 s ahead of its time; held then by the overlap policy and
    released by an ack before its time, it is due at its time, not at the ack."""
    q = make_queue()
    q.schedules.upsert("ahead", "a", every=2, overlap="buffer_one")
    (running,) = take_fires(q, 1, ack=False)
    wait_until(nudged(q, lambda: (q.schedules.get("ahead") or _never()).fired >= 2), timeout=10)
    running.ack()  # within the second before the held fire's time
    (held,) = take_fires(q, 1, timeout=5, ack=False)
    assert fire_ms(held) == fire_ms(running) + 2000
    assert held.delivered_ms >= fire_ms(held), "never early"
    held.ack()


def test_overlap_buffer_all_runs_each_in_turn(make_queue: Make, client: redis.Redis) -> None:
    q = make_queue()
    q.schedules.upsert("all", "a", every=1, overlap="buffer_all")
    (running,) = take_fires(q, 1, ack=False)
    buffer = f"{q.keys.prefix}:{{{q.name}}}:sched:buf:all"
    wait_until(nudged(q, lambda: client.llen(buffer) >= 2), timeout=10)
    running.ack()
    first, second = take_fires(q, 2, timeout=5)
    assert fire_ms(running) < fire_ms(first) < fire_ms(second)


def test_overlap_allow_all_fires_while_one_runs(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("many", "m", every=1, overlap="allow_all")
    running = take_fires(q, 1, ack=False)[0]
    others = take_fires(q, 2, ack=False)
    assert fire_ms(running) < fire_ms(others[0]) < fire_ms(others[1])
    info = q.schedules.get("many")
    assert info is not None and info.running == 3


# -- edits, remove, re-create ----------------------------------------------------------------


EDITS: list[dict[str, Any]] = [
    {"every": 2},
    {"cron": "* * * * * *"},
    {"cron": "* * * * * *", "tz": "Europe/London"},
    {"phase": 0.5},
    {"jitter": 0.2},
    {"overlap": "allow_all"},
    {"catchup": "all"},
    {"catchup_window": 30},
    {"max_fires": 1000},
    {"start": datetime(2020, 1, 1, tzinfo=UTC)},
    {"end": datetime(2100, 1, 1, tzinfo=UTC)},
    {"priority": 5},
    {"headers": {"team": "ops"}},
]


def test_every_field_edited_while_a_fire_is_pending(make_queue: Make) -> None:
    """Each edit bumps the version; a fire not yet due (jittered) is replaced, not doubled;
    the next fire carries the new spec."""
    q = make_queue()
    seen: set[int] = set()
    base: dict[str, Any] = {"every": 1}
    for version, edit in enumerate(EDITS, start=2):
        q.schedules.upsert("edit", {"v": version - 1}, **base)
        spec = {**({"every": 1} if "cron" not in edit else {}), **edit}
        info = q.schedules.upsert("edit", {"v": version}, **spec)
        assert info.changed and info.version >= version, edit
        (task,) = take_fires(q, 1)
        assert task.payload == {"v": version}, edit
        assert fire_ms(task) not in seen, f"time fired twice after {edit}"
        seen.add(fire_ms(task))
        if "priority" in edit:
            assert task.priority == 5
        if "headers" in edit:
            assert task.headers["team"] == "ops"
    info = q.schedules.get("edit")
    assert info is not None and info.version == 2 * len(EDITS)


def test_edit_drops_the_fire_not_yet_due(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("j", "old", every=2, jitter=1.9)
    wait_until(nudged(q, lambda: q.stats().delayed == 1), timeout=10)  # jittered: not yet due
    q.schedules.upsert("j", "new", every=2)
    assert q.stats().delayed == 0
    (task,) = take_fires(q, 1)
    assert task.payload == "new"


def test_remove_and_recreate_goes_on_from_the_cursor(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("rr", "a", every=1)
    before = take_fires(q, 2)
    assert q.schedules.remove("rr") is True
    assert q.schedules.remove("rr") is False
    assert q.schedules.get("rr") is None
    assert q.poll(timeout=1.5) is None, "a removed schedule fires no more"
    info = q.schedules.upsert("rr", "b", every=1)
    assert info.version == 2, "the tombstone kept the version"
    after = take_fires(q, 2)
    assert fire_ms(after[0]) > fire_ms(before[-1])
    assert all(t.payload == "b" for t in after)


# -- pause, resume, trigger, backfill ----------------------------------------------------------


def test_pause_and_resume_are_idempotent_and_skip_the_paused_fires(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("p", "p", every=1)
    take_fires(q, 1)
    assert q.schedules.pause("p", note="deploy") is True
    assert q.schedules.pause("p") is False
    info = q.schedules.get("p")
    assert info is not None and info.paused and info.note == "deploy" and info.next_fire is None
    assert q.poll(timeout=2.5) is None
    paused_at = time.time()
    assert q.schedules.resume("p") is True
    assert q.schedules.resume("p") is False
    (task,) = take_fires(q, 1)
    assert fire_ms(task) >= paused_at * 1000 - 1, "the paused fires are skipped"


def test_trigger_obeys_overlap_and_is_idempotent_per_request(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("t", "t", cron="0 0 1 1 *")  # yearly: only the trigger fires
    fired = q.schedules.trigger("t", request="r1")
    assert fired == "s:t:m:r1"
    assert q.schedules.trigger("t", request="r1") == "s:t:m:r1"
    (task,) = take_fires(q, 1, ack=False)
    assert task.schedule == "t" and task.id == fired
    assert q.schedules.trigger("t", request="r2") is None, "skipped: one runs"
    task.ack()
    assert q.poll(timeout=0.2) is None, "the same request did not fire twice"
    info = q.schedules.get("t")
    assert info is not None and info.manual == 1 and info.skipped == 1
    with pytest.raises(ScheduleNotFound):
        q.schedules.trigger("nope")


def test_backfill_offers_each_time_once_per_request(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("b", "b", cron="0 * * * *", tz="America/New_York")
    start = datetime(2026, 11, 1, 0, 0, tzinfo=UTC) + timedelta(hours=4)  # 00:00 EDT
    end = start + timedelta(hours=3)
    assert q.schedules.backfill("b", start, end, request="nov1") == 4
    assert q.schedules.backfill("b", start, end, request="nov1") == 4, "a retry: no new fires"
    fires = take_fires(q, 4)
    assert q.poll(timeout=0.2) is None
    local = sorted(t.fire_time.astimezone(ZONE_NY).strftime("%H:%M%z") for t in fires)  # type: ignore[union-attr]
    assert local == ["00:00-0400", "01:00-0400", "01:00-0500", "02:00-0500"]
    with pytest.raises(ConfigError, match="more than 100"):
        q.schedules.backfill("b", start, start + timedelta(days=10))


# -- limits ---------------------------------------------------------------------------------------


def test_max_fires_and_end_finish_the_schedule(make_queue: Make) -> None:
    q = make_queue()
    q.schedules.upsert("two", "x", every=1, max_fires=2)
    take_fires(q, 2)
    assert q.poll(timeout=1.5) is None
    info = q.schedules.get("two")
    assert info is not None and info.done and info.fired == 2 and info.next_fire is None
    end = datetime.now(UTC) + timedelta(seconds=1.5)
    q.schedules.upsert("ends", "e", every=1, end=end)
    wait_until(nudged(q, lambda: (q.schedules.get("ends") or _never()).done), timeout=10)


def test_bad_upserts_are_clear_errors_and_write_nothing(make_queue: Make) -> None:
    q = make_queue()
    with pytest.raises(ConfigError, match="not id"):
        q.schedules.upsert("bad", "x", every=1, id="fixed")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="set by delayq"):
        q.schedules.upsert("bad", "x", every=1, headers={"delayq-schedule": "x"})
    with pytest.raises(ConfigError, match="invalid schedule name"):
        q.schedules.upsert("a|b", "x", every=1)
    with pytest.raises(ConfigError, match="exactly one"):
        q.schedules.upsert("bad", "x")
    assert q.schedules.list() == []


# -- layouts ----------------------------------------------------------------------------------


def test_sharded_queue_keeps_each_schedule_on_one_shard(make_queue: Make) -> None:
    q = make_queue("sharded", shards=4)
    names = [f"s{i}" for i in range(6)]
    for name in names:
        q.schedules.upsert(name, name, every=1)
    fires = take_fires(q, 18, timeout=20)
    per = {n: sorted(fire_ms(t) for t in fires if t.schedule == n) for n in names}
    for name, times in per.items():
        assert len(times) == len(set(times)), f"{name} fired a time twice"
    assert sorted(i.name for i in q.schedules.list()) == names


# -- queues without schedules ----------------------------------------------------------------


def test_a_queue_without_schedules_makes_one_exists_look(make_queue: Make, redis_url: str) -> None:
    """Watched with MONITOR: each script call on a plain queue touches the schedule keys at
    most once, with one EXISTS (and an ack after a fetch not at all)."""
    q = make_queue("plain")
    q.offer("x")
    lines: list[str] = []
    url = redis_url
    with redis.Redis.from_url(url) as watcher, watcher.monitor() as monitor:
        done = threading.Event()

        def read() -> None:
            for command in monitor.listen():
                lines.append(command["command"])
                if "delayq-done" in command["command"]:
                    done.set()
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.2)
        take_fires(q, 1)
        with redis.Redis.from_url(url) as other:
            other.echo("delayq-done")
        assert done.wait(5)
    scripts = [line for line in lines if line.startswith("EVALSHA")]
    # A plain fetch or ack names the schedule keys in its call (for its one EXISTS): the
    # call, not a command run on them.
    touching = [line for line in lines if ":sched" in line and not line.startswith("EVALSHA")]
    assert touching and all(line.startswith("EXISTS") for line in touching), touching
    assert len(touching) <= len(scripts), "at most one look per script call"


# -- metrics ----------------------------------------------------------------------------------


def test_exporter_reports_schedule_fires_next_fire_and_last_success(
    make_queue: Make, redis_url: str, prefix: str
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from delayq.metrics import QueueCollector

    q = make_queue("jobs")
    sharded = make_queue("spread", shards=2)
    q.schedules.upsert("beat", "b", every=1)
    q.schedules.upsert("nightly", "n", cron="30 2 * * *", tz="Europe/London")
    sharded.schedules.upsert("s1", "s", every=60)
    take_fires(q, 2)
    assert q.schedules.pause("nightly")
    collector = QueueCollector(redis_url, prefix=prefix)
    try:
        text = collector.render()
    finally:
        collector.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def get(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted(labels.items()))))

    beat = {"queue": "jobs", "schedule": "beat"}
    assert (get("delayq_schedule_fires_total", outcome="fired", **beat) or 0) >= 2
    assert get("delayq_schedule_fires_total", outcome="missed", **beat) == 0
    assert get("delayq_schedule_period_seconds", **beat) == 1.0
    next_fire = get("delayq_schedule_next_fire_timestamp_seconds", **beat)
    assert next_fire is not None and abs(next_fire - time.time()) < 5
    assert get("delayq_schedule_last_success_timestamp_seconds", **beat) is not None
    nightly = {"queue": "jobs", "schedule": "nightly"}
    assert get("delayq_schedule_paused", **nightly) == 1
    assert get("delayq_schedule_next_fire_timestamp_seconds", **nightly) is None
    assert get("delayq_schedule_period_seconds", **nightly) == 86400
    assert get("delayq_schedule_period_seconds", queue="spread", schedule="s1") == 60


def test_a_sleeping_consumer_wakes_for_a_new_schedules_first_fire(make_queue: Make) -> None:
    """The upsert announces the chain's new earliest time on the queue's channel: a consumer
    asleep on a 30 s safety interval takes the first fire on time, not 30 s later."""
    consumer = make_queue(safety_interval=30)
    producer = make_queue()
    assert consumer.poll(timeout=0) is None  # subscribed, and asleep on an empty queue
    got: list[Task] = []
    waiting = threading.Thread(target=lambda: got.append(consumer.poll(timeout=10)))  # type: ignore[arg-type]
    waiting.start()
    time.sleep(0.3)  # let the consumer fall asleep (not a correctness wait)
    producer.schedules.upsert("wake", "w", every=1)
    waiting.join(15)
    assert got and got[0] is not None, "the consumer slept through the first fire"
    assert got[0].lateness_ms < 1000


# -- a paused queue (flow control, issue #20) ------------------------------------------------


def test_a_paused_queue_keeps_the_cursor_and_catches_up_by_policy_on_resume(
    make_queue: Make,
) -> None:
    """While the queue is paused its consumers keep looking but no fire is made or handed
    out; on resume the default catch-up ("latest") runs one late fire, counts the times the
    pause covered as missed, and the chain goes on from there: no flood, no time twice."""
    q = make_queue()
    q.schedules.upsert("tick", "t", every=1)
    before = take_fires(q, 1)
    q.pause(note="maintenance")
    paused_at = time.monotonic()
    wait_until(nudged(q, lambda: time.monotonic() - paused_at > 4), timeout=10, interval=0.05)
    assert q.poll(timeout=0) is None, "a paused queue hands out nothing"
    missed_before = q.schedules.get("tick").missed  # type: ignore[union-attr]
    assert q.resume() is True
    nudge(q)
    burst: list[Task] = []
    while (task := q.poll(timeout=0)) is not None:
        burst.append(task)
        task.ack()
    # one catch-up fire, plus at most the one made ahead before the pause began
    assert 1 <= len(burst) <= 2, [fire_ms(t) for t in burst]
    info = q.schedules.get("tick")
    assert info is not None and info.missed >= missed_before + 2, info
    after = take_fires(q, 2)
    times = [fire_ms(t) for t in before + burst + after]
    assert times == sorted(set(times)), "no fire time twice, in order"
    assert fire_ms(after[-1]) - fire_ms(after[0]) == 1000, "the chain goes on, once a second"

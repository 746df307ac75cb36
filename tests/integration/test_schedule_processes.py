"""Schedules with consumers in separate processes (issue #19's "exactly once" tests): several
workers racing, each upserting the same schedule at start; a worker SIGKILLed mid-chain
again and again; Redis SIGKILLed and restarted from its append-only file. Every time from the
first fire to the schedule's cursor must fire once (a fire's redelivery after a lost lease
is the same task, attempts > 1, not a second fire), and none may be missing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

pytest_plugins = ["tests.faults_support"]

WORKER = Path(__file__).parent / "procs" / "schedule_worker.py"


class Proc:
    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-u", str(WORKER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().decode()
        assert line.startswith("ready"), line

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    made: list[Proc] = []

    def start(*args: str) -> Proc:
        made.append(Proc(*args))
        return made[-1]

    yield start
    for proc in made:
        proc.kill()


def records(client: redis.Redis, prefix: str) -> list[tuple[int, int]]:
    """(fire ms, attempts) of every delivery the workers recorded."""
    rows = [raw.decode().split("|") for raw in client.lrange(f"{prefix}:fires", 0, -1)]
    return [(int(ms), int(attempts)) for ms, _pid, attempts in rows]


def check_exactly_once(q: DelayQueue, client: redis.Redis, prefix: str, name: str) -> int:
    """Pause the schedule, let lapsed leases come back and drain them here, then check that
    each time from the first fire to the cursor fired once. Returns how many times fired."""
    assert q.schedules.pause(name)
    deadline = time.monotonic() + 6  # leases of killed workers (2 s) run out and come back
    while time.monotonic() < deadline:
        task = q.poll(timeout=0.5)
        if task is not None:
            assert task.fire_time is not None
            ms = round(task.fire_time.timestamp() * 1000)
            client.rpush(f"{prefix}:fires", f"{ms}|test|{task.attempts}")
            task.ack()
    assert q.stats().total == 0, "every fire was delivered and acked"
    got = records(client, prefix)
    first_deliveries = Counter(ms for ms, attempts in got if attempts == 1)
    twice = [ms for ms, n in first_deliveries.items() if n > 1]
    assert not twice, f"times fired twice: {twice}"
    info = q.schedules.get(name)
    assert info is not None and info.last_fire is not None
    last = round(info.last_fire.timestamp() * 1000)
    fired = set(first_deliveries)
    expected = set(range(min(fired), last + 1, 1000))
    assert fired == expected, f"missing: {sorted(expected - fired)}"
    assert info.fired == len(fired) and info.missed == 0 and info.skipped == 0
    return len(fired)


def test_workers_racing_with_concurrent_upserts_fire_each_time_once(
    redis7_server: EmbeddedRedis, spawn: Callable[..., Proc], prefix: str
) -> None:
    url = redis7_server.url
    client = redis.Redis.from_url(url)
    procs = [spawn(url, prefix, "race", "beat", "1") for _ in range(3)]
    with DelayQueue("race", url, prefix=prefix) as q:
        wait_until(lambda: len(records(client, prefix)) >= 8, timeout=30)
        for proc in procs:
            proc.kill()
        info = q.schedules.get("beat")
        assert info is not None and info.version == 1, "50 upserts of one spec: one version"
        assert check_exactly_once(q, client, prefix, "beat") >= 8
    client.close()


def test_worker_sigkilled_mid_chain_again_and_again(
    redis7_server: EmbeddedRedis, spawn: Callable[..., Proc], prefix: str
) -> None:
    url = redis7_server.url
    client = redis.Redis.from_url(url)
    procs = [spawn(url, prefix, "kill", "beat", "1") for _ in range(3)]
    with DelayQueue("kill", url, prefix=prefix) as q:
        for round_ in range(4):
            seen = len(records(client, prefix))
            wait_until(lambda seen=seen: len(records(client, prefix)) >= seen + 2, timeout=30)
            victim = procs.pop(round_ % len(procs))
            victim.kill()
            procs.append(spawn(url, prefix, "kill", "beat", "1"))
        for proc in procs:
            proc.kill()
        assert check_exactly_once(q, client, prefix, "beat") >= 8
    client.close()


def test_redis_sigkilled_and_restarted_from_aof_mid_chain(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """The cursor is in the append-only file with the fires: after kill -9 and a restart no
    time fires twice; the times that fell in the outage are caught up ("latest") and counted."""
    client = redis.Redis.from_url(own_server7.url)
    seen: list[tuple[int, int]] = []
    with DelayQueue("aof", own_server7.url, prefix=prefix, reconnect_timeout=15) as q:
        q.schedules.upsert("beat", "b", every=1, overlap="allow_all")

        def take(count: int) -> None:
            goal = len(seen) + count
            deadline = time.monotonic() + 30
            while len(seen) < goal and time.monotonic() < deadline:
                task = q.poll(timeout=1)
                if task is not None:
                    assert task.fire_time is not None
                    seen.append((round(task.fire_time.timestamp() * 1000), task.attempts))
                    task.ack()
            assert len(seen) >= goal

        take(3)
        own_server7.kill()
        own_server7.start()
        take(3)
        assert q.schedules.pause("beat")
        first = Counter(ms for ms, attempts in seen if attempts == 1)
        assert all(n == 1 for n in first.values()), f"a time fired twice: {first}"
        info = q.schedules.get("beat")
        assert info is not None and info.last_fire is not None
        last = round(info.last_fire.timestamp() * 1000)
        span = (last - min(first)) // 1000 + 1
        assert len(first) + info.missed >= span, "every time fired or was counted missed"
        assert info.fired == len(first) + q.stats().total
    client.close()

"""stats() carries what monitoring needs: delivery lateness buckets and consumer liveness."""

from __future__ import annotations

import math
import re
from importlib import resources

from delayq._core.protocol import LATENESS_BUCKETS_MS


def test_lua_buckets_match_python_constant() -> None:
    source = resources.files("delayq._core").joinpath("lua/fetch.lua").read_text()
    match = re.search(r"local LATE_BOUNDS = \{([^}]*)\}", source)
    assert match is not None
    assert tuple(int(x) for x in match.group(1).split(",")) == LATENESS_BUCKETS_MS


def test_fresh_queue_has_no_lateness_and_no_consumer(make_queue) -> None:
    q = make_queue()
    q.offer({"n": 1}, delay=60)
    stats = q.stats()
    assert stats.consumer_seen_at is None
    assert sum(stats.lateness.values()) == 0 and stats.lateness_sum == 0
    assert "seen_ms" not in stats.counters
    assert not any(k.startswith("late:") for k in stats.counters)


def test_deliveries_land_in_lateness_buckets(make_queue, client) -> None:
    q = make_queue()
    q.offer_many([({"n": i}, 0) for i in range(5)])
    # Three tasks made ~3 s late by moving their due time back: they must land in the 5 s bucket.
    late_ids = q.offer_many([({"late": i}, 0) for i in range(3)])
    for task_id in late_ids:
        info = q.get(task_id)
        assert info is not None and info.due_at is not None
        q.reschedule(task_id, at=info.due_at.timestamp() - 3)
    tasks = q.poll_many(10, timeout=5)
    assert len(tasks) == 8
    stats = q.stats()
    assert sum(stats.lateness.values()) == stats.counters["delivered"] == 8
    assert stats.lateness[5.0] == 3  # 2.5 s < ~3 s <= 5 s
    assert sum(n for bound, n in stats.lateness.items() if bound <= 2.5) == 5
    assert stats.lateness[math.inf] == 0
    assert 9 <= stats.lateness_sum <= 9 + 5  # 3 tasks ~3 s late, plus the prompt ones' few ms
    assert stats.consumer_seen_at is not None
    assert abs(stats.consumer_seen_at.timestamp() - tasks[0].delivered_ms / 1000) < 1


def test_an_empty_fetch_still_marks_the_consumer_seen(make_queue) -> None:
    q = make_queue()
    q.offer({"n": 1}, delay=60)
    assert q.poll(timeout=0) is None
    assert q.stats().consumer_seen_at is not None

"""The exporter's series stay bounded however many queues exist (issue #23: 50,000 queue
names made 150,011 series, 9 MB and about a second a scrape): the queues that need someone
first get series of their own, the rest are summed under ``queue="_other"``."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis


def test_a_scrape_of_many_queues_keeps_the_worst_and_sums_the_rest(
    redis_server: EmbeddedRedis, prefix: str, make_queue: Callable[..., DelayQueue]
) -> None:
    pytest.importorskip("prometheus_client")
    from delayq.metrics import QueueCollector

    for i in range(30):
        make_queue(f"tenant-{i:02d}").offer_many([(i, 3600)] * (i + 1))  # tenant-29: 30 tasks
    make_queue("late").offer("overdue", 0)  # overdue once a second has passed
    collector = QueueCollector(redis_server.url, prefix=prefix, max_queues=10, overdue_after=0.001)
    try:
        page = collector.render()
    finally:
        collector.close()
    delayed = dict(re.findall(r'delayq_tasks\{queue="([^"]+)",state="delayed"\} (\S+)', page))
    named = set(re.findall(r'queue="([^"]+)"', page))
    assert len(named) == 10 and "_other" in named, sorted(named)
    assert "late" in named  # an overdue queue is never folded away
    assert "tenant-29" in named and "tenant-00" not in named  # then the biggest
    assert sum(float(v) for v in delayed.values()) == sum(range(1, 31))  # nothing lost
    assert float(delayed["_other"]) == sum(range(1, 23))  # tenant-00 .. tenant-21


def test_max_queues_must_be_positive(redis_server: EmbeddedRedis) -> None:
    pytest.importorskip("prometheus_client")
    from delayq.metrics import QueueCollector

    with pytest.raises(ValueError, match="max_queues"):
        QueueCollector(redis_server.url, max_queues=0)

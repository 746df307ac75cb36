# Generated from _async/test_smoke.py by scripts/unasync.py: do not edit.
"""The round trip, and a consumer woken by an earlier task, on each front end."""

from __future__ import annotations

import time

from delayq import DelayQueue

from .flavor import sleep, spawn


def test_offer_take_ack_roundtrip(make_queue) -> None:
    q: DelayQueue = make_queue()
    task_id = q.offer({"order_id": 42}, delay=0.2)
    started = time.monotonic()
    task = q.poll(timeout=5)
    assert task is not None and task.id == task_id
    assert task.payload == {"order_id": 42}
    assert time.monotonic() - started >= 0.15
    assert task.delivered_ms >= task.due_ms
    task.ack()
    assert q.get(task_id) is None
    assert (q.stats()).counters["acked"] == 1


def test_an_earlier_task_wakes_a_sleeping_consumer(make_queue) -> None:
    """Only the pub/sub hint can wake this consumer in time: its safety re-check is 30 s away
    and the task it sleeps for is due in 20 s."""
    q: DelayQueue = make_queue(safety_interval=30)
    producer: DelayQueue = make_queue()
    producer.offer("later", delay=20)
    started = time.monotonic()
    assert q.poll(timeout=0) is None
    assert time.monotonic() - started < 0.5, "subscribing must not stall a poll"
    waiting = spawn(q.poll, timeout=10)
    try:
        sleep(0.3)  # let the consumer fall asleep on the 20 s task (not a correctness wait)
        offered = time.monotonic()
        task_id = producer.offer("sooner", delay=0.2)
        task = waiting.result(15)
        assert task is not None and task.id == task_id
        assert 0.15 <= time.monotonic() - offered < 2.0
    finally:
        waiting.cancel()

# Generated from _async/test_schedule_api.py by scripts/unasync.py: do not edit.
"""q.schedules on each front end: the same calls, awaited on DelayQueue (the sync twin
is generated from this file)."""

from __future__ import annotations

import time

from delayq import DelayQueue


def test_schedules_round_trip(make_queue) -> None:
    q: DelayQueue = make_queue()
    info = q.schedules.upsert("beat", {"n": 1}, every=1, overlap="allow_all")
    assert info.changed and info.version == 1 and len(info.next_fires) == 5
    assert not (q.schedules.upsert("beat", {"n": 1}, every=1, overlap="allow_all")).changed
    deadline = time.monotonic() + 15
    task = None
    while task is None and time.monotonic() < deadline:
        task = q.poll(timeout=1)
    assert task is not None and task.schedule == "beat" and task.fire_time is not None
    assert task.id == f"s:beat:{round(task.fire_time.timestamp() * 1000)}"
    task.ack()
    fired = q.schedules.trigger("beat", request="once")
    assert fired == "s:beat:m:once"
    assert q.schedules.pause("beat", note="n")
    assert (q.schedules.get("beat")).paused  # type: ignore[union-attr]
    assert q.schedules.resume("beat")
    assert [i.name for i in q.schedules.list()] == ["beat"]
    assert q.schedules.remove("beat")
    assert q.schedules.get("beat") is None

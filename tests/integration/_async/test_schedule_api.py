"""q.schedules on each front end: the same calls, awaited on AsyncDelayQueue (the sync twin
is generated from this file)."""

from __future__ import annotations

import time

from delayq import AsyncDelayQueue


async def test_schedules_round_trip(make_async_queue) -> None:
    q: AsyncDelayQueue = make_async_queue()
    info = await q.schedules.upsert("beat", {"n": 1}, every=1, overlap="allow_all")
    assert info.changed and info.version == 1 and len(info.next_fires) == 5
    assert not (await q.schedules.upsert("beat", {"n": 1}, every=1, overlap="allow_all")).changed
    deadline = time.monotonic() + 15
    task = None
    while task is None and time.monotonic() < deadline:
        task = await q.poll(timeout=1)
    assert task is not None and task.schedule == "beat" and task.fire_time is not None
    assert task.id == f"s:beat:{round(task.fire_time.timestamp() * 1000)}"
    await task.ack()
    fired = await q.schedules.trigger("beat", request="once")
    assert fired == "s:beat:m:once"
    assert await q.schedules.pause("beat", note="n")
    assert (await q.schedules.get("beat")).paused  # type: ignore[union-attr]
    assert await q.schedules.resume("beat")
    assert [i.name for i in await q.schedules.list()] == ["beat"]
    assert await q.schedules.remove("beat")
    assert await q.schedules.get("beat") is None

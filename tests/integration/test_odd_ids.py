"""Listing tasks whose id is not UTF-8 (planted by another client): ``tasks()`` reads them as
fetch and ``dead()`` do, instead of failing the whole page."""

from __future__ import annotations

from collections.abc import Callable

import redis

from delayq import DelayQueue

from .test_poison import RAW_ID, envelope_of, plant_raw_id


def test_tasks_lists_a_dead_task_with_a_raw_id(
    client: redis.Redis, make_queue: Callable[..., DelayQueue]
) -> None:
    q = make_queue("raw")
    plant_raw_id(client, q, envelope_of(client, q, {"planted": True}))
    assert q.poll(timeout=0) is None  # the planted task is dead-lettered by its bytes
    (row,) = q.tasks("dead")
    assert row.id.encode("utf-8", "surrogateescape") == RAW_ID
    assert row.payload == {"planted": True}

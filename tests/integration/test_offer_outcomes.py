"""Offers say what happened: ``offer``/``offer_many`` return :class:`TaskId` values whose
``outcome`` is created, existing or replaced, and a caller id held by a task with other content
raises :class:`TaskIdConflict`. On both front ends, against real Redis."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from delayq import Offer, OfferOutcome, TaskId, TaskIdConflict
from tests.integration.test_api import Threaded

CREATED, EXISTING, REPLACED = OfferOutcome.CREATED, OfferOutcome.EXISTING, OfferOutcome.REPLACED


@pytest.fixture(params=["sync", "async"])
def queue(request: pytest.FixtureRequest, make_queue: Any, make_async_queue: Any) -> Any:
    """Factory of queues of both flavours; the sync one behind an awaitable adapter."""
    if request.param == "async":
        return make_async_queue

    def make(name: str = "q", **options: Any) -> Threaded:
        return Threaded(make_queue(name, **options))

    return make


def outcomes(ids: list[TaskId]) -> list[OfferOutcome]:
    return [task_id.outcome for task_id in ids]


async def offered(q: Any) -> int:
    return int((await q.stats()).counters.get("offered", 0))


async def test_a_new_task_is_created_and_its_id_is_still_a_plain_str(queue: Callable[..., Any]):
    q = queue()
    for task_id in (await q.offer("plain", 60), await q.offer("options", 60, priority=2)):
        assert isinstance(task_id, TaskId) and isinstance(task_id, str)
        assert task_id.outcome is CREATED and task_id.created
        assert task_id == str(task_id) and hash(task_id) == hash(str(task_id))
        assert json.loads(json.dumps({"id": task_id})) == {"id": str(task_id)}
        assert (await q.get(task_id)) is not None


async def test_dedup_keep_reports_the_existing_task(queue: Callable[..., Any]) -> None:
    q = queue()
    first = await q.offer({"v": 1}, 60, key="user:7")
    again = await q.offer({"v": 2}, 1, key="user:7")
    assert first.outcome is CREATED
    assert again == first and again.outcome is EXISTING and not again.created
    assert (await q.get(first)).payload == {"v": 1}
    assert await offered(q) == 1


async def test_dedup_replace_reports_the_replaced_task(queue: Callable[..., Any]) -> None:
    q = queue()
    first = await q.offer({"v": 1}, 60, key="user:7", dedup="replace")
    again = await q.offer({"v": 2}, 60, key="user:7", dedup="replace")
    assert again == first and again.outcome is REPLACED and not again.created
    assert (await q.get(first)).payload == {"v": 2}
    # once in flight, a task is no longer replaced: the offer finds it and keeps it
    await q.reschedule(first, 0)
    task = await q.poll(timeout=5)
    kept = await q.offer({"v": 3}, 0, key="user:7", dedup="replace")
    assert kept == first and kept.outcome is EXISTING
    await task.ack()


async def test_a_repeated_caller_id_with_the_same_content_is_existing(queue) -> None:
    q = queue()
    first = await q.offer("same", 60, id="job-1")
    again = await q.offer("same", 5, id="job-1")  # a retry after a timeout; the delay may differ
    assert (first.outcome, again.outcome) == (CREATED, EXISTING)
    assert first == again == "job-1"
    assert await offered(q) == 1


async def test_a_caller_id_held_by_other_content_is_a_conflict(queue) -> None:
    q = queue()
    await q.offer("first", 60, id="job-1", headers={"h": "1"})
    for payload, options in [
        ("second", {}),  # another payload
        ("first", {}),  # the same payload without the headers
        ("first", {"headers": {"h": "1"}, "priority": 3}),
    ]:
        with pytest.raises(TaskIdConflict, match="job-1") as caught:
            await q.offer(payload, 60, id="job-1", **options)
        assert caught.value.task_ids == ["job-1"]
        assert [str(r) for r in caught.value.results] == ["job-1"]
    info = await q.get("job-1")
    assert info.payload == "first" and dict(info.headers) == {"h": "1"}  # kept unchanged
    assert (await q.stats()).delayed == 1 and await offered(q) == 1


async def test_a_conflict_also_while_the_task_is_in_flight(queue) -> None:
    q = queue()
    await q.offer("first", 0, id="job-1")
    task = await q.poll(timeout=5)
    assert (await q.offer("first", id="job-1")).outcome is EXISTING
    with pytest.raises(TaskIdConflict):
        await q.offer("third", id="job-1")
    await task.ack()


async def test_offer_many_reports_every_outcome_in_order(queue) -> None:
    q = queue()
    held = await q.offer("held", 60, key="k-held")
    await q.offer("job", 60, id="job-1")
    ids = await q.offer_many(
        [
            ("plain", 60),
            Offer("keyed", 60, key="k-new"),
            Offer("same key in this batch", 60, key="k-new"),
            Offer("another", 60, key="k-held"),
            Offer("job", 60, id="job-1"),
            Offer("new caller id", 60, id="job-2"),
        ]
    )
    assert outcomes(ids) == [CREATED, CREATED, EXISTING, EXISTING, EXISTING, CREATED]
    assert ids[2] == ids[1] and ids[3] == held and ids[4] == "job-1" and ids[5] == "job-2"
    replaced = await q.offer_many(
        [Offer("new", 60, key="k-held"), Offer("newer", 60, key="k-held")], dedup="replace"
    )
    assert outcomes(replaced) == [REPLACED, REPLACED] and replaced == [held, held]
    assert (await q.get(held)).payload == "newer"


async def test_plain_bulk_offers_are_all_created(queue) -> None:
    q = queue()
    ids = await q.offer_many([(n, 60) for n in range(1500)])  # two script calls
    assert set(outcomes(ids)) == {CREATED} and len(set(ids)) == 1500


async def test_offer_many_writes_the_rest_then_raises_on_conflicts(queue) -> None:
    q = queue()
    await q.offer("a", 60, id="job-1")
    await q.offer("b", 60, id="job-2")
    items = [
        ("plain", 60),
        Offer("other", 60, id="job-1"),
        Offer("b", 60, id="job-2"),
        Offer("other", 60, id="job-2b"),
        Offer("x", 60, id="job-3"),
        Offer("y", 60, id="job-3"),  # the same id twice in one call, other content: conflict
    ]
    with pytest.raises(TaskIdConflict) as caught:
        await q.offer_many(items)
    assert caught.value.task_ids == ["job-1", "job-3"]
    results = caught.value.results
    assert [r.outcome.value for r in results] == [
        "created",
        "conflict",
        "existing",
        "created",
        "created",
        "conflict",
    ]
    assert (await q.get(results[0])).payload == "plain"
    assert (await q.get("job-1")).payload == "a" and (await q.get("job-3")).payload == "x"
    assert (await q.stats()).delayed == 5


async def test_the_same_caller_id_twice_with_the_same_content_in_one_call(queue) -> None:
    q = queue()
    ids = await q.offer_many([Offer("x", 60, id="job-1"), Offer("x", 60, id="job-1")])
    assert outcomes(ids) == [CREATED, EXISTING]


def test_task_ids_survive_pickling_and_say_what_they_are() -> None:
    task_id = TaskId("abc", OfferOutcome.REPLACED)
    back = pickle.loads(pickle.dumps(task_id))
    assert isinstance(back, TaskId) and back == "abc" and back.outcome is OfferOutcome.REPLACED
    assert repr(task_id) == "TaskId('abc', outcome='replaced')"
    assert TaskId("abc").created and str(task_id) == "abc"

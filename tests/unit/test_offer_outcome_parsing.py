"""From the offer scripts' statuses to what an offer did (delayq._core.offers): pure."""

from __future__ import annotations

import pickle

import pytest

from delayq import OfferOutcome, TaskId, TaskIdConflict
from delayq._core.offers import check_conflicts, task_id_of, task_ids_of
from delayq._core.protocol import OfferSpec


@pytest.mark.parametrize(
    ("status", "drawn", "returned", "outcome"),
    [
        (1, True, "a", OfferOutcome.CREATED),
        (1, False, "a", OfferOutcome.CREATED),
        (2, True, "holder", OfferOutcome.REPLACED),
        (0, True, "holder", OfferOutcome.EXISTING),  # a dedup key held by another task
        (0, False, "a", OfferOutcome.EXISTING),  # the caller's id, same content
        (0, True, "a", OfferOutcome.CREATED),  # our own drawn id: an earlier attempt wrote it
        (3, False, "a", OfferOutcome.CONFLICT),
    ],
)
def test_each_status_means_one_outcome(
    status: int, drawn: bool, returned: str, outcome: OfferOutcome
) -> None:
    task_id = task_id_of(returned, status, "a", drawn)
    assert task_id == returned and task_id.outcome is outcome
    assert task_id.created is (outcome is OfferOutcome.CREATED)


def test_conflicts_raise_with_every_result() -> None:
    ok = [TaskId("a"), TaskId("b", OfferOutcome.EXISTING)]
    assert check_conflicts(ok) is ok
    results = [TaskId(f"id-{n}", OfferOutcome.CONFLICT) for n in range(5)] + ok
    with pytest.raises(TaskIdConflict, match="'id-0', 'id-1', 'id-2' and 2 more") as caught:
        check_conflicts(results)
    assert caught.value.task_ids == [f"id-{n}" for n in range(5)]
    assert caught.value.results == results


def test_a_whole_call_is_read_in_order_and_created_ids_are_full_task_ids() -> None:
    specs = [OfferSpec(i, "d0", b'="x"') for i in ("a", "b", "c", "d")]
    replies = [[b"a", 1, b"holder", 0], [b"c", 0, b"d", 2]]  # two chunks, as Redis answers
    ids, statuses = task_ids_of(replies, specs, [True, True, True, True])
    assert statuses == [1, 0, 0, 2]
    assert ids == ["a", "holder", "c", "d"] and all(isinstance(i, TaskId) for i in ids)
    assert [i.outcome.value for i in ids] == ["created", "existing", "created", "replaced"]
    assert pickle.loads(pickle.dumps(ids[0])).outcome is OfferOutcome.CREATED


def test_a_call_that_created_every_task_returns_the_offered_ids() -> None:
    specs = [OfferSpec(i, "d0", b'="x"') for i in ("a", "b", "c")]
    ids, statuses = task_ids_of([[b"a", 1, b"b", 1], [b"c", 1]], specs, [False] * 3)
    assert ids == ["a", "b", "c"] and statuses == [1, 1, 1]
    assert all(type(i) is TaskId and i.created for i in ids)

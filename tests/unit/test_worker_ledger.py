"""The workers' bookkeeping (``Ledger``), driven directly with a fake clock: no Redis, no
threads. Both workers make the same calls in the same order; these are the decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

import pytest

from delayq._workers.ledger import ROOM_STEP_S, Delivery, Ledger, Pace

_tokens = count(1)


@dataclass(frozen=True)
class FakeTask:
    id: str
    lease_token: int = field(default_factory=lambda: next(_tokens))


def make(index: int, task: FakeTask, started: float) -> Delivery:
    return Delivery(index, task, started)


PACE = Pace(capacity=10, refill=4, ack_batch=3, ack_delay_s=0.02)


def ledger(queues: int = 1, pace: Pace = PACE) -> Ledger[Delivery]:
    return Ledger(queues, pace)


def tasks(*ids: str) -> list[FakeTask]:
    return [FakeTask(i) for i in ids]


def run(book: Ledger[Delivery], index: int = 0) -> Delivery:
    delivery = book.take(index, make)
    assert delivery is not None
    return delivery


# -- the heartbeat and the ack race ----------------------------------------------------------


def test_lease_lost_for_a_task_acked_since_the_heartbeat_took_its_list_is_no_news() -> None:
    """The heartbeat lists the leases to extend; the handler finishes and its ack lands; then
    the heartbeat's extend of that lease reports it gone. That is the ack's doing, not a lost
    lease: before, the worker logged "lease ... expired while held" and dropped it twice."""
    book = ledger()
    (task,) = tasks("a")
    book.fetched(0, [task])
    delivery = run(book)
    assert book.to_extend(0) == [task]  # the heartbeat's list, taken now
    book.done(delivery, now=0.0)
    book.ended(delivery)
    batch = book.acks_due(0, now=0.0)
    assert batch == [task]
    assert book.acked(0, batch, [True]) == []
    assert book.held() == 0
    assert book.lease_lost(0, task) is False  # the extend's LeaseLost arrives: nothing to say
    assert book.held() == 0 and book.to_extend(0) == [] and book.unsettled() == []


def test_lease_lost_while_the_ack_is_on_its_way_is_left_to_the_ack() -> None:
    book = ledger()
    (task,) = tasks("a")
    book.fetched(0, [task])
    delivery = run(book)
    heartbeat_list = book.to_extend(0)
    book.done(delivery, now=0.0)
    book.ended(delivery)
    batch = book.acks_due(0, now=0.0)  # sent, no reply yet
    assert heartbeat_list == [task]
    assert book.lease_lost(0, task) is False
    assert book.held() == 1  # still the ack's to settle, once
    assert book.acked(0, batch, [False]) == [task]  # the ack reports the loss, once
    assert book.held() == 0


def test_a_lease_really_lost_is_news_once_and_its_waiting_task_is_not_run() -> None:
    book = ledger()
    first, second = tasks("a", "b")
    book.fetched(0, [first, second])
    assert book.lease_lost(0, second) is True
    assert book.lease_lost(0, second) is False  # reported once
    assert book.to_extend(0) == [first]
    assert run(book).task is first
    assert book.take(0, make) is None  # "b" may be another consumer's by now


def test_lease_lost_of_an_old_copy_leaves_the_new_delivery_of_the_same_id_alone() -> None:
    book = ledger()
    (old,) = tasks("a")
    book.fetched(0, [old])
    run(book)  # its handler ran past the lease, and failed
    book.given_back(0, old)
    new = FakeTask("a")  # delivered again, with a new lease
    book.fetched(0, [new])
    assert book.lease_lost(0, old) is False
    assert book.to_extend(0) == [new]


def test_given_back_tasks_are_no_longer_extended_nor_reported() -> None:
    book = ledger()
    (task,) = tasks("a")
    book.fetched(0, [task])
    book.take(0, make)
    book.given_back(0, task)  # retried or rejected: the verdict is on its way
    assert book.to_extend(0) == [] and book.lease_lost(0, task) is False


# -- fetching --------------------------------------------------------------------------------


def test_with_tasks_waiting_a_fetch_waits_for_a_batch_of_refill() -> None:
    """One fetch per free slot made a burst cost a fetch script per task."""
    book = ledger()
    assert book.room(0) == 10  # empty: all of it
    book.fetched(0, tasks(*"abcdefghij"))
    assert book.room(0) == 0
    free = []
    for _ in range(4):
        delivery = run(book)
        book.done(delivery, now=0.0)
        free.append(book.ended(delivery))
    assert free == [False, False, False, True]
    assert book.room(0) == 4


def test_with_the_buffer_empty_any_room_is_used() -> None:
    book = ledger()
    book.fetched(0, tasks(*"abcdefghij"))
    running = [run(book) for _ in range(10)]  # all running, none waiting
    assert book.room(0) == 0
    book.done(running[0], now=0.0)
    assert book.ended(running[0]) is True  # one free and a handler idle: fetch one now
    assert book.room(0) == 1


def test_an_abandoned_delivery_ends_once() -> None:
    book = ledger()
    book.fetched(0, tasks("a"))
    delivery = run(book)
    assert book.ended(delivery) is True
    assert book.ended(delivery) is False and book.busy() == 0


def test_queues_are_counted_apart() -> None:
    book = ledger(queues=2)
    book.fetched(0, tasks(*"abcdefghij"))
    assert book.room(0) == 0 and book.room(1) == 10
    assert book.take(1, make) is None


def test_unstarted_empties_the_buffer_for_the_shutdown() -> None:
    book = ledger()
    fetched = tasks("a", "b", "c")
    book.fetched(0, fetched)
    started = run(book)
    assert book.unstarted(0) == fetched[1:]
    for task in fetched[1:]:
        book.given_back(0, task)  # handed back
    assert book.unsettled() == [(0, started.task)]  # cut off by the grace period, say


# -- acking ----------------------------------------------------------------------------------


def test_acks_wait_for_a_batch_while_handlers_run() -> None:
    book = ledger()
    book.fetched(0, tasks(*"abcde"))
    running = [run(book) for _ in range(5)]
    assert book.done(running[0], now=0.0) is True  # the first: the ack loop starts its clock
    assert book.acks_due(0, now=0.0) == []
    assert book.done(running[1], now=0.001) is False
    assert book.done(running[2], now=0.002) is True  # ack_batch reached
    assert [t.id for t in book.acks_due(0, now=0.002)] == ["a", "b", "c"]
    assert book.next_ack_in(0.002) is None


def test_an_ack_pending_behind_a_verdict_still_on_its_way_wakes_the_ack_loop() -> None:
    """Before: a Retry(0)'s task came back and succeeded while the first attempt's handler
    still awaited its retry call; that ack was not due (a handler's verdict was pending), so
    the ack loop, asleep for want of acks, was never woken: the task stayed in flight, its
    lease kept alive by the heartbeat, until the worker stopped."""
    book = ledger()
    book.fetched(0, tasks("a"))
    first = run(book)
    book.given_back(0, first.task)  # retried: its handler awaits the retry call
    book.fetched(0, tasks("a"))  # due again at once, fetched by another handler slot
    second = run(book)
    assert book.done(second, now=1.0) is True  # not due, but the loop must set its timer
    assert book.next_ack_in(1.0) == pytest.approx(0.02)
    book.ended(first)
    assert [t.id for t in book.acks_due(0, now=1.0)] == ["a"]  # no handler left: due now


def test_acks_go_after_the_delay_or_when_no_handler_runs() -> None:
    book = ledger()
    book.fetched(0, tasks("a", "b", "c"))
    first, second, third = (run(book) for _ in range(3))
    book.done(first, now=1.0)
    book.ended(first)
    assert book.next_ack_in(1.005) == pytest.approx(0.015)
    assert book.acks_due(0, now=1.005) == []
    assert [t.id for t in book.acks_due(0, now=1.02)] == ["a"]  # waited long enough
    book.ended(second)  # failed: given back, no ack
    book.given_back(0, second.task)
    assert book.done(third, now=2.0) is True  # the last handler running: no reason to wait
    assert [t.id for t in book.acks_due(0, now=2.0)] == ["c"]


def test_a_failed_ack_is_due_again_at_once_ahead_of_newer_ones() -> None:
    book = ledger()
    book.fetched(0, tasks(*"abcdef"))
    running = [run(book) for _ in range(6)]
    for delivery in running[:3]:
        book.done(delivery, now=0.0)
    batch = book.acks_due(0, now=0.0)
    book.done(running[3], now=0.0)
    book.ack_failed(0, batch)
    assert book.next_ack_in(0.0) == 0.0
    assert [t.id for t in book.acks_due(0, now=0.0)] == ["a", "b", "c", "d"]


def test_closing_makes_every_pending_ack_due() -> None:
    book = ledger()
    book.fetched(0, tasks("a", "b"))
    first, _ = run(book), run(book)
    book.done(first, now=0.0)
    assert book.acks_due(0, now=0.0) == []
    book.closing = True
    assert [t.id for t in book.acks_due(0, now=0.0)] == ["a"]


def test_a_done_task_is_extended_until_its_ack_is_through_and_not_handed_back() -> None:
    """An ack held up (its Redis away, or behind another queue's) must not let the lease
    lapse: the task would run again (before: a done task was no longer extended)."""
    book = ledger()
    book.fetched(0, tasks("a", "b"))
    first, second = run(book), run(book)
    book.done(first, now=0.0)
    assert book.to_extend(0) == [first.task, second.task]
    assert book.unsettled() == [(0, second.task)]
    book.closing = True  # the ack goes at once
    batch = book.acks_due(0, now=0.0)
    assert batch == [first.task] and book.acked(0, batch, [True]) == []
    assert book.to_extend(0) == [second.task]
    assert book.to_extend(1) == []


def test_default_pace_batches_a_burst() -> None:
    pace = Pace.of(slots=8, prefetch=32)
    assert (pace.capacity, pace.refill, pace.ack_batch) == (40, 16, 40)  # a buffer's acks
    assert Pace.of(slots=4, prefetch=0).refill == 1  # no prefetch: every free slot counts
    assert Pace.of(slots=4, prefetch=0).ack_batch == 16
    assert Pace.of(slots=200, prefetch=800).ack_batch == 100  # one ack call stays short


def test_a_fetch_waits_in_short_steps_while_room_may_grow() -> None:
    """A fetch for less than a full buffer waits ROOM_STEP_S at a time (handlers still
    running free more room meanwhile); one for all of it waits the worker's poll timeout."""
    book: Ledger = Ledger(1, PACE)
    assert book.fetch_wait(PACE.capacity, 0.5) == 0.5
    assert book.fetch_wait(PACE.capacity - 1, 0.5) == ROOM_STEP_S
    assert book.fetch_wait(1, 0.01) == 0.01


# -- leases that run out in the buffer --------------------------------------------------------


def test_a_waiting_task_whose_lease_no_extension_reached_is_dropped_not_run() -> None:
    """Before: a task waiting in the buffer while Redis refused the heartbeat's extensions
    (maxmemory) was begun after its lease ran out, when another consumer may have had it:
    the soak's fencing tokens out of order."""
    book = ledger()
    a, b, c = tasks("a", "b", "c")
    book.fetched(0, [a, b, c], start_by=10.0)
    book.extended(0, b, start_by=20.0)  # only b's extension got through
    first = book.take(0, make, now=5.0)
    assert first is not None and first.task is a  # in time
    second = book.take(0, make, now=15.0)
    assert second is not None and second.task is b
    assert second.started == 15.0  # the clock take() read is the handler's start
    assert book.take(0, make, now=15.0) is None  # c's lease may be gone: dropped
    assert book.dropped == [c]
    assert book.lapsed() == [c] and book.lapsed() == [] and book.dropped == []
    assert c not in book.to_extend(0) and book.held() == 2  # no longer this worker's


def test_tasks_without_a_lease_wait_as_long_as_they_must() -> None:
    book = ledger()
    book.fetched(0, tasks("a"))  # at-most-once: no start_by
    delivery = book.take(0, make, now=1e9)
    assert delivery is not None and book.lapsed() == []

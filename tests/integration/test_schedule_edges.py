"""Schedules at their edges (a review's findings, each test failing before its fix): a pause
that outlives a remove, a skipped trigger retried, buffer_one against max_fires, a fire held
through a pause, a pause just before the last fire."""

from __future__ import annotations

import time
from collections.abc import Callable

from delayq import DelayQueue
from tests.helpers import wait_until
from tests.integration.test_schedules import _never, nudged, take_fires

Make = Callable[..., DelayQueue]


def test_remove_then_upsert_of_a_paused_schedule_is_active(make_queue: Make) -> None:
    """A paused schedule removed and created again under its name is a new, active schedule:
    upsert has no 'paused' option, and nothing says the old pause survives a remove."""
    q = make_queue()
    q.schedules.upsert("rp", "a", every=1)
    assert q.schedules.pause("rp", note="deploy") is True
    assert q.schedules.remove("rp") is True
    info = q.schedules.upsert("rp", "b", every=1)
    assert info.paused is False, f"re-created schedule is still paused (note={info.note!r})"
    (task,) = take_fires(q, 1, timeout=5)
    assert task.payload == "b"


def test_trigger_retry_of_a_skipped_request_returns_none(make_queue: Make) -> None:
    """trigger returns None when the overlap policy skipped it; the same request again (a
    retry after a timeout) 'does nothing again', so it must not name a fire that never was."""
    q = make_queue()
    q.schedules.upsert("t", "t", cron="0 0 1 1 *")  # yearly: only triggers fire
    assert q.schedules.trigger("t", request="r1") == "s:t:m:r1"
    (running,) = take_fires(q, 1, ack=False)
    assert q.schedules.trigger("t", request="r2") is None, "skipped: one runs"
    again = q.schedules.trigger("t", request="r2")
    assert again is None, f"retry of a skipped trigger returned {again!r}, no such task"
    running.ack()


def test_max_fires_with_buffer_one_runs_max_fires_times(make_queue: Make) -> None:
    """max_fires=3 with overlap=buffer_one: a held fire replaced by a newer one is counted
    skipped, so it must not use up one of the three fires."""
    q = make_queue()
    q.schedules.upsert("m", "m", every=1, max_fires=3, overlap="buffer_one")
    (first,) = take_fires(q, 1, ack=False)
    # hold the first fire while two more times pass: the second is held, then replaced
    wait_until(nudged(q, lambda: (q.schedules.get("m") or _never()).skipped >= 1), timeout=10)
    first.ack()
    got = [first]
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        task = q.poll(timeout=0.5)
        if task is not None:
            got.append(task)
            task.ack()
    info = q.schedules.get("m")
    assert info is not None
    assert len(got) == 3, (
        f"max_fires=3 but {len(got)} fires ran: fired={info.fired} skipped={info.skipped} "
        f"done={info.done}"
    )


def test_a_paused_schedule_offers_no_held_fire(make_queue: Make) -> None:
    """pause(name) stops firing: a fire held by buffer_one must not be offered while the
    schedule is paused, when the running fire ends."""
    q = make_queue()
    q.schedules.upsert("pb", "p", every=1, overlap="buffer_one")
    (running,) = take_fires(q, 1, ack=False)
    wait_until(nudged(q, lambda: (q.schedules.get("pb") or _never()).fired >= 2), timeout=10)
    assert q.schedules.pause("pb") is True
    running.ack()
    task = q.poll(timeout=2.5)
    assert task is None, f"fire {task.id if task else ''} offered while its schedule is paused"
    assert q.schedules.resume("pb") is True  # the held fire goes out now
    (held,) = take_fires(q, 1, timeout=5)
    assert held.schedule == "pb"


def test_pause_resume_before_the_last_fire_keeps_max_fires(make_queue: Make) -> None:
    """max_fires=2: the second fire is made ahead of its time; pause drops it (its time given
    back, fired decremented), resume must go on so that the second fire still runs."""
    q = make_queue()
    q.schedules.upsert("mf", "x", every=2, max_fires=2)
    take_fires(q, 1)
    wait_until(nudged(q, lambda: (q.schedules.get("mf") or _never()).fired >= 2), timeout=10)
    assert q.schedules.pause("mf") is True  # within the second before the 2nd fire's time
    paused = q.schedules.get("mf")
    assert paused is not None and paused.fired == 1, "the dropped fire is not counted"
    assert q.schedules.resume("mf") is True
    info = q.schedules.get("mf")
    assert info is not None
    assert not (info.done and info.fired < 2), (
        f"done after {info.fired} of max_fires=2 fires (next_fire={info.next_fire})"
    )
    (second,) = take_fires(q, 1, timeout=8)
    assert second.schedule == "mf"

"""The asyncio consumer waits for a due time by the timer to TIMER_SLACK before it and yields
the rest away (asyncio's timers fire up to ~1 ms late); threads need no slack."""

from __future__ import annotations

import asyncio
import time

from delayq._async import backend as async_backend
from delayq._async.queue import _timer_left
from delayq._sync import backend as sync_backend


async def test_wait_out_returns_at_its_time_and_lets_other_tasks_run() -> None:
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    runner = asyncio.create_task(other())
    await asyncio.sleep(0)
    for _ in range(20):
        until = time.monotonic() + async_backend.TIMER_SLACK
        await async_backend.wait_out(until)
        assert time.monotonic() >= until  # never early
        assert time.monotonic() - until < 0.05  # generous: a loop turn, not a timer tick
    runner.cancel()
    assert turns > 20  # the other task ran during every wait


def test_the_timer_stops_short_of_a_due_time_but_not_of_a_timeout() -> None:
    now = time.monotonic()
    due = now + 1.0
    left = _timer_left(due, due)  # waiting for a due time
    assert 1.0 - async_backend.TIMER_SLACK - 0.01 < left <= 1.0 - async_backend.TIMER_SLACK
    timeout = now + 0.5
    assert 0.49 < _timer_left(timeout, due) <= 0.5  # the caller's timeout comes first: in full
    assert 0 < async_backend.TIMER_SLACK < 0.005


def test_threads_wait_without_slack() -> None:
    assert sync_backend.TIMER_SLACK == 0.0
    until = time.monotonic() - 1
    assert sync_backend.wait_out(until) is None

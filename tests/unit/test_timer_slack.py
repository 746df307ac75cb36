"""The asyncio consumer waits for a due time by the timer to TIMER_SLACK before it and yields
the rest away (asyncio's timers fire up to ~1 ms late); threads need no slack."""

from __future__ import annotations

import asyncio
import time

from delayq._async import backend as async_backend
from delayq._core.wakeups import plan_wait
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
    slack = async_backend.TIMER_SLACK
    assert 0 < slack < 0.005
    plan = plan_wait(100.0, [101.0], None, slack)  # waiting for a due time
    assert plan.until == 101.0 and plan.timer_s == 1.0 - slack
    plan = plan_wait(100.0, [101.0], 100.5, slack)  # the caller's timeout comes first: in full
    assert plan.until == 100.5 and plan.timer_s == 0.5


def test_the_wait_is_for_the_earliest_shard() -> None:
    plan = plan_wait(10.0, [12.0, 10.25, 30.0], None, 0.0)
    assert plan.until == 10.25 and plan.timer_s == 0.25
    plan = plan_wait(10.0, [12.0, 9.0], None, 0.001)  # one is overdue: no timer wait
    assert plan.until == 9.0 and plan.timer_s < 0
    plan = plan_wait(10.0, [12.0], 12.0, 0.001)  # a deadline equal to the due time
    assert plan.until == 12.0 and plan.timer_s == 2.0 - 0.001


def test_threads_wait_without_slack() -> None:
    assert sync_backend.TIMER_SLACK == 0.0
    until = time.monotonic() - 1
    assert sync_backend.wait_out(until) is None

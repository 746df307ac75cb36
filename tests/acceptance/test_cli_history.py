"""``delayq history ID`` and ``delayq get`` of a task that ended, run as a user runs them: a
subprocess per command against the test's own redis-server (issue #22's task history)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime

from delayq import DelayQueue
from delayq._core.history import origin
from tests.acceptance.test_cli import run_many

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "handlers.py", line 12, in close_order\n'
    "    raise ValueError(order)\n"
    "ValueError: order 42 is locked\n"
)


def finished_task(q: DelayQueue) -> str:
    """A task offered, failed once with a traceback, then acked."""
    task_id = q.offer({"order": 42}, 0)
    task = q.poll(timeout=5)
    assert task is not None
    task.retry(0, error=TRACEBACK)
    task = q.poll(timeout=5)
    assert task is not None
    task.ack()
    return task_id


def test_history_prints_a_timeline_and_json(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    orders = queue("orders", history=60)
    task_id = finished_task(orders)
    queue("other").offer("x", 0)  # a queue without histories is searched too, harmlessly
    table, by_queue, doc, got, got_json, helped = run_many([
        ["history", task_id, *target],
        ["history", task_id, "--queue", "orders", *target],
        ["history", task_id, "-q", "orders", "--json", *target],
        ["get", "orders", task_id, *target],
        ["get", "orders", task_id, "--json", *target],
        ["history", "--help"],
    ])  # fmt: skip
    assert table.code == 0, table
    assert f"task {task_id} in orders: 5 events" in table.out
    rows = [line.split() for line in table.out.splitlines() if re.match(r"\s*\d{4}-", line)]
    kinds = [parts[3] if parts[2].startswith("+") else parts[2] for parts in rows]
    assert kinds == ["offered", "delivered", "retried", "delivered", "acked"], table.out
    assert "ValueError: order 42 is locked" in table.out and "Traceback" not in table.out
    assert f"by {origin()}, due now" in table.out
    assert by_queue.code == 0 and by_queue.out == table.out
    (found,) = doc.json()
    assert found["queue"] == "orders" and found["id"] == task_id
    assert [e["kind"] for e in found["events"]] == [
        "offered", "delivered", "retried", "delivered", "acked",
    ]  # fmt: skip
    assert [e["attempt"] for e in found["events"]] == [0, 1, 1, 2, 2]
    assert datetime.fromisoformat(found["events"][0]["at"]).tzinfo is not None
    assert got.code == 0 and "done" in got.out and "acked" in got.out, got
    info = got_json.json()
    assert info["state"] == "done" and info["outcome"] == "acked" and info["attempts"] == 2
    assert info["payload"] is None and info["ended_at"]
    assert helped.code == 0 and "Example: delayq history" in helped.out and "--queue" in helped.out


def test_history_explains_why_it_found_none(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    plain = queue("plain")
    plain.offer("x", 0)
    unknown_anywhere, off, unknown_queue, bad_id = run_many([
        ["history", "nope", *target],
        ["history", "nope", "--queue", "plain", *target],
        ["history", "nope", "--queue", "plian", *target],
        ["history", "", "--queue", "plain", *target],
    ])  # fmt: skip
    unknown_anywhere.failed_with("no history of task 'nope'", "no queue keeps task histories")
    off.failed_with("queue 'plain' keeps no task histories", "history=timedelta(days=1)")
    unknown_queue.failed_with("unknown queue 'plian'", "did you mean 'plain'")
    bad_id.failed_with("id must be a non-empty", code=2)
    queue("kept", history=60).offer("y", 0)
    (missing,) = run_many([["history", "nope", *target]])
    missing.failed_with("no history of task 'nope' in any queue", "keeping histories: kept")
    (get_missing,) = run_many([["get", "kept", "nope", *target]])
    get_missing.failed_with("no task 'nope' in queue 'kept'")

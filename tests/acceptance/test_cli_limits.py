"""``delayq pause`` / ``resume`` (and ``limits``) as a user runs them: subprocesses against the
test's own server and prefix."""

from __future__ import annotations

from datetime import datetime

from .test_cli import Run, dq, queue, target  # noqa: F401 (fixtures)


def test_pause_and_resume(dq: Run, queue) -> None:  # noqa: F811
    q = queue("orders")
    q.offer("x", 0)
    paused = dq("pause", "orders", "--until", "30m", "--note", "maintenance", "--json").json()
    assert paused["paused"] and paused["note"] == "maintenance"
    assert datetime.fromisoformat(paused["until"]) > datetime.fromisoformat(paused["since"])
    assert q.poll(timeout=0.2) is None
    stats = dq("stats", "orders")
    assert stats.code == 0 and "orders [paused until " in stats.out, stats
    assert dq("stats", "orders", "--json").json()[0]["paused"] is True
    forever = dq("pause", "orders")
    assert forever.code == 0 and "paused orders until resumed" in forever.out, forever
    assert "orders [paused]" in dq("stats", "orders").out
    assert dq("resume", "orders").out.strip() == "resumed orders"
    assert dq("resume", "orders").out.strip() == "orders was not paused"
    task = q.poll(timeout=5)
    assert task is not None and task.payload == "x"


def test_pause_refusals(dq: Run, queue) -> None:  # noqa: F811
    queue("orders").offer("x", 0)
    dq("pause", "orders", "--until", "2020-01-01T00:00:00Z").failed_with("not after")
    dq("pause", "orders", "--until", "soon").failed_with("--until", code=2)
    dq("pause", "nosuch").failed_with("unknown queue 'nosuch'")
    assert dq("stats", "orders", "--json").json()[0]["paused"] is False

"""``delayq pause`` / ``resume`` (and ``limits``) as a user runs them: subprocesses against the
test's own server and prefix."""

from __future__ import annotations

from datetime import datetime

from .test_cli import Run, dq  # noqa: F401 (fixtures; target and queue are in conftest.py)


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


def test_limits_set_list_remove(dq: Run, queue) -> None:  # noqa: F811
    q = queue("orders")
    q.offer("x", 0)
    assert "no limits" in dq("limits", "list", "orders").out
    made = dq("limits", "set", "orders", "tenant:42", "--rate", "10", "--concurrency", "2")
    assert made.out.strip() == "orders tenant:42: 10/s, concurrency 2", made
    assert dq("limits", "set", "orders", "~default", "--concurrency", "1").code == 0
    for i in range(3):
        offered = dq("offer", "orders", str(i), "--delay", "0", "--limit-key", "tenant:7")
        assert offered.code == 0, offered
    held = q.poll_many(10, timeout=2)
    assert sorted(t.payload for t in held if t.payload != "x") == [0]  # the default: 1 at once
    rows = {row["key"]: row for row in dq("limits", "list", "orders", "--json").json()}
    assert rows["tenant:42"]["limit"]["concurrency"] == 2
    assert rows["tenant:7"]["limit"] is None and rows["tenant:7"]["limit_of"] == "~default"
    assert (rows["tenant:7"]["running"], rows["tenant:7"]["waiting"]) == (1, 2)
    table = dq("limits", "list", "orders").out
    assert "tenant:7" in table and "(~default)" in table, table
    assert dq("limits", "remove", "orders", "tenant:42").code == 0
    dq("limits", "remove", "orders", "tenant:42").failed_with("no limit of its own")
    dq("limits", "set", "orders", "t", "--rate", "0").failed_with("rate must be")
    dq("limits", "set", "orders", "t").failed_with("needs a rate")
    dq("limits", "set", "orders", "~x", "--concurrency", "1").failed_with("reserved")
    dq("offer", "orders", "1", "--delay", "0", "--limit-key", "*").failed_with("reserved")

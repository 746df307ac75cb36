"""A positive delay is never due early, not even by the part of a millisecond the server's
clock had already run; a zero delay is due at once."""

from __future__ import annotations

from delayq import Offer


def _server_us(client) -> int:
    seconds, micros = client.time()
    return seconds * 1_000_000 + micros


def test_delays_count_from_the_next_whole_millisecond(make_queue, client) -> None:
    q = make_queue()
    for offer in (
        lambda: q.offer("one", 0.05),  # offer_one.lua
        lambda: q.offer("keyed", 0.05, key="k", priority=1),  # offer.lua
        lambda: q.offer_many([("bulk", 0.05)])[0],
    ):
        for _ in range(30):
            before_us = _server_us(client)
            info = q.get(offer())
            assert info is not None and info.due_at is not None
            due_us = round(info.due_at.timestamp() * 1_000_000)
            # once under a loaded CI run (Valkey 8), untraced: say by how much
            assert due_us >= before_us + 50_000, (due_us - before_us, info)
            q.purge(["delayed"])


def test_reschedule_by_a_delay_is_never_early(make_queue, client) -> None:
    q = make_queue()
    task_id = q.offer("x", 60)
    for _ in range(30):
        before_us = _server_us(client)
        assert q.reschedule(task_id, 0.05) is True
        info = q.get(task_id)
        assert info is not None and info.due_at is not None
        assert info.due_at.timestamp() * 1_000_000 >= before_us + 50_000


def test_a_zero_delay_is_ready_at_once(make_queue) -> None:
    q = make_queue()
    q.offer("now", 0)
    q.offer_many([Offer("now too", 0, key="k")])
    assert q.stats().ready == 2

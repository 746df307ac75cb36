"""Two producers can draw the same 14-character id: the offer scripts tell a resend of the same
task (status 0) from another task holding the id (status 3), and the queue draws again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from delayq import Offer
from delayq._core import offers, protocol
from delayq._core.scripts import Op
from delayq.exceptions import ServerError, TaskIdConflict

TAKEN = "0Q8taken0Q8tak"


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], list[int]]:
    """``draws(n)``: the next n ids drawn (by any offer path) are all TAKEN; returns a list
    that records how many ids each call to the generator made."""

    def arm(n: int) -> list[int]:
        real = protocol.new_task_ids
        left = [n]
        calls: list[int] = []

        def fake(count: int) -> list[str]:
            calls.append(count)
            ids = real(count)
            for i in range(count):
                if left[0] > 0:
                    ids[i] = TAKEN
                    left[0] -= 1
            return ids

        monkeypatch.setattr(protocol, "new_task_ids", fake)
        for module in (protocol, offers):  # a single offer draws with new_task_id
            monkeypatch.setattr(module, "new_task_id", lambda: fake(1)[0])
        return calls

    return arm


def payload_of(q: Any, task_id: str) -> Any:
    info = q.get(task_id)
    assert info is not None, task_id
    return info.payload


def test_single_offer_draws_again_when_another_task_holds_the_id(make_queue, draws) -> None:
    q = make_queue()
    draws(2)
    first = q.offer("first", 60)
    second = q.offer("second", 60)
    assert first == TAKEN and second != TAKEN and len(second) == protocol.ID_LENGTH
    assert payload_of(q, first) == "first" and payload_of(q, second) == "second"
    assert q.stats().delayed == 2 and q.stats().counters["offered"] == 2


def test_offer_with_options_draws_again(make_queue, draws) -> None:
    q = make_queue()
    draws(2)
    first = q.offer("first", 60, priority=3)
    second = q.offer("second", 60, priority=3, key="k")
    assert first == TAKEN and second != TAKEN
    assert payload_of(q, second) == "second" and q.stats().delayed == 2


def test_bulk_offer_draws_again_only_for_the_taken_ids(make_queue, draws) -> None:
    q = make_queue()
    draws(1)
    assert q.offer("holder", 60) == TAKEN
    calls = draws(2)  # the first two ids of the bulk call are taken
    items: list[Any] = [(n, 60) for n in range(5)] + [Offer("x", 60, key="kx")]
    ids = q.offer_many(items)
    assert TAKEN not in ids and len(set(ids)) == 6
    assert [payload_of(q, i) for i in ids] == [0, 1, 2, 3, 4, "x"]
    assert payload_of(q, TAKEN) == "holder"
    assert calls == [6, 2]  # the batch, then one call for the two taken ids
    assert q.stats().delayed == 7


def test_a_chosen_id_held_by_other_content_is_kept_not_redrawn(make_queue) -> None:
    q = make_queue()
    assert q.offer("a", 60, id="order-1") == "order-1"
    assert q.offer("a", 60, id="order-1") == "order-1"  # a repeated offer: a no-op
    with pytest.raises(TaskIdConflict):  # other content: kept, and reported
        q.offer("b", 60, id="order-1")
    with pytest.raises(TaskIdConflict):
        q.offer_many([Offer("c", 60, id="order-1")])
    assert payload_of(q, "order-1") == "a" and q.stats().delayed == 1


def test_a_resent_offer_is_recognised_as_itself(make_queue) -> None:
    """The same call sent twice (a lost reply): the second finds its own task, status 0."""
    q = make_queue()
    spec = protocol.OfferSpec(protocol.new_task_id(), "d60000", b'="same"')
    one = [spec.id, spec.due, spec.envelope]
    shard = q._engine(q.name)  # the unsharded queue's one shard
    assert shard.run(Op.OFFER_ONE, one, keys=shard._offer_one_keys) == 1
    assert shard.run(Op.OFFER_ONE, one, keys=shard._offer_one_keys) == 0
    other = [spec.id, spec.due, b'="other"']
    assert shard.run(Op.OFFER_ONE, other, keys=shard._offer_one_keys) == protocol.ID_TAKEN
    args = protocol.offer_args(q._dedup, [spec])
    assert protocol.parse_offer(shard.run(Op.OFFER, args)) == [(spec.id, 0)]
    args = protocol.offer_args(q._dedup, [spec._replace(envelope=b'="other"')])
    assert protocol.parse_offer(shard.run(Op.OFFER, args)) == [(spec.id, 3)]
    assert q.stats().delayed == 1 and payload_of(q, spec.id) == "same"


def test_gives_up_with_a_clear_error_when_every_draw_is_taken(make_queue, draws) -> None:
    q = make_queue()
    draws(1)
    q.offer("holder", 60)
    draws(100)
    with pytest.raises(ServerError, match="ids were all taken"):
        q.offer("lost?", 60)
    with pytest.raises(ServerError, match="ids were all taken"):
        q.offer_many([("lost?", 60)])
    assert q.stats().delayed == 1  # nothing half-written


async def test_async_offers_draw_again(make_async_queue, draws) -> None:
    q = make_async_queue()
    draws(3)
    first = await q.offer("first", 60)
    second = await q.offer("second", 60)
    (third,) = await q.offer_many([("third", 60)])
    assert first == TAKEN and TAKEN not in (second, third) and second != third
    payloads = [(await q.get(i)).payload for i in (first, second, third)]  # type: ignore[union-attr]
    assert payloads == ["first", "second", "third"]

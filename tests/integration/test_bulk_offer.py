"""offer_many's fast path: ids made in bulk, chunks pipelined in order on one connection."""

from __future__ import annotations

from delayq import Offer
from delayq._core import protocol
from delayq._core.models import DedupMode
from delayq._core.offers import build_offer
from delayq._core.scripts import Op

from ..helpers import wait_until


def test_bulk_ids_are_unique_sorted_and_well_formed() -> None:
    ids = protocol.new_task_ids(5000) + protocol.new_task_ids(3) + [protocol.new_task_id()]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # ids sort in the order they were made, across batches
    assert all(len(i) == 14 and i.isascii() for i in ids)


def test_pipelined_chunks_recover_from_a_script_flush_in_order(make_queue, client) -> None:
    q = make_queue()
    chunks = [
        [build_offer(q._codec, Offer("first", 60, key="k"))],
        [build_offer(q._codec, Offer("second", 60, key="k"))],
        [build_offer(q._codec, Offer(n, 60)) for n in range(3)],
    ]
    client.script_flush()  # every pipelined call now answers NOSCRIPT
    replies = q._engine(q.name).write(
        Op.OFFER,
        [protocol.offer_args(DedupMode.KEEP, chunk) for chunk in chunks],
        [spec.id for chunk in chunks for spec in chunk],
    )
    (first,), (second,), rest = (protocol.parse_offer(r) for r in replies)
    assert first[1] == 1 and second == (first[0], 0)  # the later offer of the key lost
    assert [status for _, status in rest] == [1, 1, 1]
    info = q.get(first[0])
    assert info is not None and info.payload == "first"
    assert q.stats().delayed == 4


def test_many_chunks_arrive_whole_and_in_order(make_queue) -> None:
    q = make_queue()
    n = protocol.OFFER_CHUNK * 4 + 7
    ids = q.offer_many([(i, 60 + i // 1000) for i in range(n)])
    assert len(set(ids)) == n
    assert q.stats().counters["offered"] == n
    for i in (0, 999, 1000, 3999, 4000, n - 1):
        info = q.get(ids[i])
        assert info is not None and info.payload == i


def test_offers_announce_only_a_new_earliest_due_time(make_queue, client) -> None:
    """Consumers sleep until the earliest due time: an offer publishes only when it moves
    earlier (single offers and bulk offers alike), so a steady stream of later tasks wakes
    nobody."""
    q = make_queue()
    pubsub = client.pubsub()
    pubsub.subscribe(q.keys.channel)
    assert wait_until(lambda: pubsub.get_message(timeout=0.1))["type"] == "subscribe"
    q.offer("first", 60)  # empty queue: announced
    q.offer("later", 120)
    q.offer_many([("later too", 90), ("later still", 100)])
    q.offer("earlier", 30)  # announced
    q.offer_many([("not", 45), ("earliest", 10)])  # announced once, with the earliest
    q.offer("keyed later", 50, key="k")
    heads = []
    while (message := pubsub.get_message(timeout=0.5)) is not None:
        heads.append(int(message["data"]))
    pubsub.close()
    dues = {info.payload: info.due_at for info in q.tasks("delayed", limit=20)}
    announced = [dues[name].timestamp() * 1000 for name in ("first", "earlier", "earliest")]
    assert heads == [round(ms) for ms in announced]  # type: ignore[union-attr]

"""A schedule's payload read back through queues of each codec (issue #19): msgpack and
pickle templates round-trip on their own queue; a reader that cannot decode one (a pickled
payload read by a JSON queue, corrupt bytes) gets ``payload_error``, never an exception, and
the chain (cron times topped up by that reader's fetches) goes on."""

from __future__ import annotations

from collections.abc import Callable

import redis

from delayq import DelayQueue
from tests.helpers import wait_until

from .test_schedules import nudge

Make = Callable[..., DelayQueue]


def test_msgpack_and_pickle_payloads_round_trip_on_their_queue(make_queue: Make) -> None:
    packed = make_queue("mp", codec="msgpack")
    packed.schedules.upsert("raw", {"blob": b"\x00\xff", "n": 1}, every=60)
    info = packed.schedules.get("raw")
    assert info is not None and info.payload == {"blob": b"\x00\xff", "n": 1}
    assert info.payload_error is None
    # msgpack envelopes say what they are: a JSON queue reads them too.
    plain = make_queue("mp")
    assert plain.schedules.get("raw").payload == {"blob": b"\x00\xff", "n": 1}
    pickled = make_queue("pk", codec="pickle")
    pickled.schedules.upsert("set", {1, 2, 3}, every=60)
    assert pickled.schedules.get("set").payload == {1, 2, 3}


def test_a_payload_the_reader_cannot_decode_is_invalid_not_an_error(
    make_queue: Make, client: redis.Redis
) -> None:
    pickled = make_queue("pk", codec="pickle")
    pickled.schedules.upsert("set", {1, 2}, every=60)
    pickled.schedules.upsert("cron", {3}, cron="* * * * * *", overlap="allow_all")
    reader = make_queue("pk")  # the default codec, JSON: it never unpickles
    info = reader.schedules.get("set")
    assert info is not None and info.payload is None
    assert info.payload_error is not None and "pickle" in info.payload_error
    state_key = f"{reader.keys.prefix}:{{pk}}:sched:st:set"
    client.hset(state_key, "tpl", b"\xc1 not an envelope")
    assert "not valid" in (reader.schedules.get("set").payload_error or "")
    assert sorted(i.name for i in reader.schedules.list()) == ["cron", "set"]
    # The JSON reader's fetches still top up the pickled cron schedule's times ahead.
    at_key = f"{reader.keys.prefix}:{{pk}}:sched:at:cron"
    client.zremrangebyrank(at_key, 1, -1)
    wait_until(lambda: nudge(reader) and client.zcard(at_key) >= 8, timeout=10)

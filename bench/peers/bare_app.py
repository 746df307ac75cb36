"""Worker side of the bare-loop reference (``python -m bench.peers.bare_app URL Q SINK HOLD``)."""

from __future__ import annotations

import json
import sys

import redis

from .bare_peer import keys
from .base import Sink

MOVE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {due, head[2] or -1, now}
"""


def main() -> None:
    url, queue, sink_path, hold = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    sink = Sink(sink_path, hold)
    client = redis.Redis.from_url(url)
    move = client.register_script(MOVE)
    delayed, events = keys(queue)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(events)
    while True:
        due, head, now = move(keys=[delayed], args=[100])
        for member in due:
            data = json.loads(member)
            sink.record(data["i"], data["due"])
        if due:
            continue
        # Sleep until the head is due, at most 10 s (delayq's default safety interval).
        wait = 10.0 if int(head) < 0 else min(10.0, (int(head) - int(now)) / 1000)
        if wait > 0:
            pubsub.get_message(timeout=wait)  # a message means an earlier head: look again


if __name__ == "__main__":
    main()

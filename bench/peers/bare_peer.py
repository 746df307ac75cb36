"""The reference, not a peer: a bare Redisson-style delayed queue in a few lines of Python.

One sorted set scored by the due time (server clock), a Lua offer that publishes when the head
moves earlier, and one worker loop that moves due members out with a script and sleeps until
the next due time or a message. No leases, acks, retries or ids: what precision costs without
any reliability. The issue's bars ask delayq to stay within 1.5x of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from .base import Contestant, Job, payload, python

OFFER = """
local t = redis.call('TIME')
local due = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[1], due, ARGV[2])
if not head[2] or due < tonumber(head[2]) then redis.call('PUBLISH', KEYS[2], due) end
return due
"""


def keys(queue: str) -> tuple[str, str]:
    return f"bare:{{{queue}}}:delayed", f"bare:{{{queue}}}:events"


class BareLoop(Contestant):
    name = "bare-loop"
    settings = (
        "reference, not a peer: a zset + Lua offer + one transfer loop (batches of 100), no "
        "acks or leases (a crash loses what it held); excluded from the best-peer ratios"
    )

    def version(self) -> str:
        from importlib.metadata import version

        return f"redis-py {version('redis')}"

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        import json

        import redis

        client = redis.Redis.from_url(url)
        offer = client.register_script(OFFER)
        delayed, events = keys(queue)
        client.ping()
        start = time.perf_counter()
        if bulk:
            pipe = client.pipeline(transaction=False)
            for n, j in enumerate(jobs, 1):
                delay_ms = max(0, math.ceil((j.due - time.time()) * 1000))
                offer(keys=[delayed, events], args=[delay_ms, json.dumps(payload(j))], client=pipe)
                if n % 1000 == 0:
                    pipe.execute()
            pipe.execute()
        else:
            for j in jobs:
                delay_ms = max(0, math.ceil((j.due - time.time()) * 1000))
                offer(keys=[delayed, events], args=[delay_ms, json.dumps(payload(j))])
        spent = time.perf_counter() - start
        client.close()
        return spent

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        return [python(), "-m", "bench.peers.bare_app", url, queue, sink, "1" if hold else "0"]

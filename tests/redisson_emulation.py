"""An emulation of Redisson's RDelayedQueue client, written from its storage facts (issue #24,
``RedissonDelayedQueue.java``), to test delayq against what Java services do: the offer
script, the transfer timer's script (due members moved in batches of 100 into the
destination list, due time judged by the client's clock), and a ``BLPOP`` consumer. Both
member formats: 3.21.1+ (``'Bc0Lc0'``) and before (``'dLc0'``).

The scripts run inside Redis's Lua as Redisson's do, so the members are packed by Redis's own
``struct`` library: a test that Python's packing matches is a test against the real thing.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import redis

from delayq._core.redisson import MemberFormat, RedissonKeys

_PACK = {MemberFormat.CURRENT: "Bc0Lc0", MemberFormat.LEGACY: "dLc0"}

_OFFER_CURRENT = """
local value = struct.pack('Bc0Lc0', string.len(ARGV[2]), ARGV[2], string.len(ARGV[3]), ARGV[3]);
redis.call('zadd', KEYS[2], ARGV[1], value);
redis.call('rpush', KEYS[3], value);
local v = redis.call('zrange', KEYS[2], 0, 0);
if v[1] == value then redis.call('publish', KEYS[4], ARGV[1]); end;
"""

# Before 3.21.1 the random id was a number packed as a double.
_OFFER_LEGACY = _OFFER_CURRENT.replace(
    "struct.pack('Bc0Lc0', string.len(ARGV[2]), ARGV[2], ",
    "struct.pack('dLc0', tonumber(ARGV[2]), ",
)

_TRANSFER = """
local expiredValues = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1], 'limit', 0, ARGV[2]);
if #expiredValues > 0 then
  for i, v in ipairs(expiredValues) do
    local randomId, value = struct.unpack('%s', v);
    redis.call('rpush', KEYS[1], value);
    redis.call('lrem', KEYS[3], 1, v);
  end;
  redis.call('zrem', KEYS[2], unpack(expiredValues));
end;
local v = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES');
if v[1] ~= nil then return v[2]; end
return nil;
"""

BATCH = 100  # Redisson's transfer batch


def now_ms() -> int:
    """``System.currentTimeMillis()``: the client's clock, which Redisson trusts."""
    return int(time.time() * 1000)


class RedissonClient:
    """One Java service's ``RDelayedQueue`` and its destination ``RBlockingQueue``."""

    def __init__(
        self,
        client: Any,
        name: str,
        fmt: MemberFormat = MemberFormat.CURRENT,
        clock_skew_ms: int = 0,
    ) -> None:
        self.client = client
        self.keys = RedissonKeys(name)
        self.format = fmt
        self.clock_skew_ms = clock_skew_ms
        self._offer = _OFFER_CURRENT if fmt is MemberFormat.CURRENT else _OFFER_LEGACY
        self._transfer = _TRANSFER % _PACK[fmt]
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._next_ms: float | None = None
        self.transfers = 0

    def now(self) -> int:
        return now_ms() + self.clock_skew_ms

    def offer(self, value: bytes, delay_ms: int) -> None:
        """``delayedQueue.offer(value, delay, MILLISECONDS)``; value = the codec's bytes."""
        keys = self.keys
        if self.format is MemberFormat.CURRENT:
            random_id: Any = os.urandom(8)
        else:
            random_id = str(random.getrandbits(53))
        self.client.eval(
            self._offer,
            4,
            keys.destination,
            keys.timeouts,
            keys.members,
            keys.channel,
            self.now() + delay_ms,
            random_id,
            value,
        )

    def transfer(self) -> int | None:
        """One run of the timer's script: moves up to 100 due members; the head's due ms."""
        keys = self.keys
        head = self.client.eval(
            self._transfer,
            3,
            keys.destination,
            keys.timeouts,
            keys.members,
            self.now(),
            BATCH,
        )
        self.transfers += 1
        return None if head is None else int(head)

    def take(self, timeout_s: float = 5.0) -> bytes | None:
        """``blockingQueue.poll(timeout)``: BLPOP on the destination list."""
        got = self.client.blpop([self.keys.destination], timeout=timeout_s)
        return None if got is None else got[1]

    # -- the transfer timer (QueueTransferTask) ---------------------------------------------

    def start_timer(self) -> None:
        """Run the transfer on start, then at the head's due time, woken by the channel."""
        self._stop.clear()
        self._timer = threading.Thread(target=self._run_timer, daemon=True)
        self._timer.start()

    def stop_timer(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._timer is not None:
            self._timer.join(10)

    def _run_timer(self) -> None:
        pubsub = self.client.pubsub()
        pubsub.subscribe(self.keys.channel)
        try:
            while not self._stop.is_set():
                head = self.transfer()
                while head is not None and head <= self.now() and not self._stop.is_set():
                    head = self.transfer()  # a full batch: more are due
                wait_s = 1.0 if head is None else max(0.0, (head - self.now()) / 1000)
                deadline = time.monotonic() + min(wait_s, 1.0)
                while not self._stop.is_set() and time.monotonic() < deadline:
                    message = pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                    if message and message["type"] == "message":
                        announced = int(message["data"])
                        if announced - self.now() < (deadline - time.monotonic()) * 1000:
                            break
        except redis.ConnectionError:
            pass
        finally:
            pubsub.close()

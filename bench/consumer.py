# ruff: noqa: RUF001  (the table and page it writes use typographic characters)
"""The plain consumer against a Redisson-style queue (issue #12): ``python -m bench.consumer``.

A burst of tasks (50,000; ``--quick`` 5,000; ``--smoke`` 200), each with a ~100-byte JSON
payload and all due at one instant, is enqueued ahead while one consumer process waits; the
consumer takes one task at a time and does the same tiny work for each (read ``payload["i"]``,
record it). Rows, run interleaved for ``--repeat`` rounds (medians reported):

- ``redisson``, the yardstick: Redisson's ``RDelayedQueue`` + ``RBlockingQueue.take()``
  rebuilt on redis-py (below); one ``BLPOP`` per task, no acks.
- ``redisson-lean``: the same without Redisson's ordering list (so without the ``LREM`` per
  task): the bare "zset -> list -> BLPOP" layout, the faster of the two here.
- ``async-redisson-lean``: the lean loop on ``redis.asyncio`` (the transfer an asyncio task
  beside the ``BLPOP`` loop, in one event loop): the yardstick of the ``async-`` rows, which
  pay asyncio's cost per round trip as it does.
- ``take``: ``while True: task = q.take(); handle(task); task.ack()`` on a sync ``DelayQueue``.
- ``poll``: the same with ``task = q.poll(timeout=1.0)`` (None: loop again).
- ``async-take``, ``async-poll``: the same on an ``AsyncDelayQueue``.
- ``consume``, ``async-consume``: ``for task in q.consume(): handle(task)`` (acking on the
  next step), when the queue has a ``consume`` method; otherwise listed as skipped.
- ``amo-take``, ``amo-poll``, ``async-amo-take``: the at-most-once queue (``ack=False``, the
  guarantee the Redisson rows give: a task taken is gone), ``take()``/``poll()`` and no ack.

Rate = tasks / (last handled - due instant). Redis commands per task are the ``INFO
commandstats`` delta from just before the due instant to the consumer's exit (Lua's own calls
included, ``INFO`` itself left out); Redis CPU is the ``INFO cpu`` delta; client CPU is the
consumer process's own (``time.process_time``, the transfer thread included for the Redisson
rows, where Redisson does that work too). The bars, against the faster of the two sync
Redisson rows measured in the same invocation (for the ``async-`` rows, against
``async-redisson-lean`` when it ran; their ratio to the sync yardstick is reported too): the
at-most-once rows (the same guarantee) >= 1.0x, the acked rows (more guarantee per task)
>= 0.85x. The idle row
(``--idle-window``, 10 s; 0 skips it) runs every consumer at once, each on its own server,
waiting on an empty queue, and counts Redis commands/s (bar: <= 2/s).

What the Redisson rows copy from Redisson (``RedissonDelayedQueue``, ``QueueTransferTask``,
``RedissonBlockingQueue``, read at redisson/redisson 6686397, 2026-08; ``RDelayedQueue`` is
deprecated there in favour of ``RReliableQueue``, but it is the layout users migrate from):

- keys: the destination list (the queue's own name), the sorted set
  ``redisson_delay_queue_timeout:{name}`` (score = due epoch ms), the ordering list
  ``redisson_delay_queue:{name}`` and the channel ``redisson_delay_queue_channel:{name}``;
- offer: one script that packs the member as ``struct.pack('Bc0Lc0', 8-byte random id,
  encoded value)``, ZADDs it, RPUSHes it to the ordering list and PUBLISHes the due time when
  the new member is the set's head;
- transfer: ``ZRANGEBYSCORE timeout 0 now LIMIT 0 100``; per member ``struct.unpack``, RPUSH
  the value to the destination list, ``LREM`` it from the ordering list; one ZREM of them all;
  reply the new head's score (ZRANGE 0 0 WITHSCORES). The client runs it once subscribed, on a
  timer at each announced due time (a later announcement replaces the timer), and again at
  once while the head it replied is due within 10 ms, as ``QueueTransferTask`` does;
- consumer: ``BLPOP list 0`` per task (``take()``), decoding the value (JSON here).

What differs: Redisson runs the transfer on Netty's event loop beside the caller's thread in a
JVM; here it is a Python thread in the consumer process, sharing the GIL with the consumer
loop. The value is the payload's JSON (Redisson's default codec is Kryo; JSON is what delayq
stores), decoded with ``json.loads``. Redisson's connection pings, retries after an error (5 s)
and its ``RTopic`` resubscription are left out. Both Redisson rows and delayq use redis-py with
hiredis, one process per consumer, the same payloads and the same server.

All of it runs against private ``redis-server`` processes on free ports (``delayq.embedded``),
never the machine's own Redis. A full run writes ``bench/results/consumer.json``; ``--quick``
and ``--smoke`` write only where ``--out`` says. ``--docs`` also writes
``docs/benchmarks-consumer.md`` (``--docs-only`` redraws it from the results file).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

import delayq
from delayq import AsyncDelayQueue, DelayQueue, Offer
from delayq.embedded import EmbeddedRedis, find_redis_server, server_version

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
QUEUE = "bench-consumer"
BAR_RATIO = 0.85  # acked rows
BAR_RATIO_AT_MOST_ONCE = 1.0
BAR_IDLE_COMMANDS_PER_S = 2.0
YARDSTICKS = ("redisson", "redisson-lean")  # the sync rows'; the faster one is the bar's
ASYNC_YARDSTICK = "async-redisson-lean"  # the async- rows' when it ran
REDISSON_ROWS = (*YARDSTICKS, ASYNC_YARDSTICK)
ROWS = (
    "redisson",
    "redisson-lean",
    "async-redisson-lean",
    "take",
    "poll",
    "async-take",
    "async-poll",
    "consume",
    "async-consume",
    "amo-take",
    "amo-poll",
    "async-amo-take",
)


@dataclass(frozen=True)
class Sizes:
    tasks: int = 50_000
    repeat: int = 3
    lead_min_s: float = 1.5  # the due instant is at least this far after the enqueue starts
    cap_s: float = 60.0  # a run stops this long after the due instant, drained or not
    idle_settle_s: float = 2.0
    idle_window_s: float = 10.0


# --layout: where Redis and the consumer run. Left to the scheduler ("free"), a round with
# the two on one core and one with them on two differ by 2-3x, for every row alike, and the
# medians of a few rounds tell more about the scheduler than about the rows. "apart" (the
# default on 2+ CPUs): Redis on CPU 0, each consumer on CPU 1, so every round trip crosses
# cores, as it crosses the network to a Redis of its own host. "shared": both on CPU 1, where
# a round trip costs no wake-up of another core and the CPU work per task decides.
CONSUMER_CPU = "DELAYQ_BENCH_CONSUMER_CPU"
LAYOUTS = {"apart": (0, 1), "shared": (1, 1)}  # layout: (server CPU, consumer CPU)


def results_name(layout: str) -> str:
    return "consumer.json" if layout != "shared" else "consumer-shared.json"


FULL = Sizes()
QUICK = Sizes(tasks=5_000, cap_s=20.0, idle_window_s=5.0)
SMOKE = Sizes(tasks=200, repeat=1, lead_min_s=0.4, cap_s=10.0, idle_settle_s=0.5, idle_window_s=1.0)


def payload(i: int) -> dict[str, Any]:
    """A ~100-byte JSON payload (98-102 bytes for i below 100,000)."""
    return {
        "i": i,
        "order_id": 1_000_000 + i,
        "user": "customer-000001@example.com",
        "sku": "A" * 24,
    }


# -- the Redisson-style delayed queue --------------------------------------------------------

# RedissonDelayedQueue.offerAsync's script, rewritten. KEYS: destination list, timeout set,
# ordering list (unused by the lean variant), channel. ARGV: due ms, random id, value, whether
# to keep the ordering list ("1"/"0").
OFFER_LUA = """
local member = struct.pack('Bc0Lc0', string.len(ARGV[2]), ARGV[2], string.len(ARGV[3]), ARGV[3])
redis.call('zadd', KEYS[2], ARGV[1], member)
if ARGV[4] == '1' then
    redis.call('rpush', KEYS[3], member)
end
local head = redis.call('zrange', KEYS[2], 0, 0)
if head[1] == member then
    redis.call('publish', KEYS[4], ARGV[1])
end
"""

# QueueTransferTask.pushTaskAsync's script, rewritten. KEYS: destination list, timeout set,
# ordering list. ARGV: now ms, batch size (100), whether to keep the ordering list.
TRANSFER_LUA = """
local due = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1], 'limit', 0, ARGV[2])
if #due > 0 then
    for _, member in ipairs(due) do
        local _, value = struct.unpack('Bc0Lc0', member)
        redis.call('rpush', KEYS[1], value)
        if ARGV[3] == '1' then
            redis.call('lrem', KEYS[3], 1, member)
        end
    end
    redis.call('zrem', KEYS[2], unpack(due))
end
local head = redis.call('zrange', KEYS[2], 0, 0, 'WITHSCORES')
if head[1] ~= nil then
    return head[2]
end
return nil
"""

TRANSFER_BATCH = 100
IMMEDIATE_MS = 10  # QueueTransferTask transfers at once when the next head is due this soon


@dataclass(frozen=True)
class RedissonKeys:
    destination: str
    timeout_set: str
    ordering: str
    channel: str

    @classmethod
    def of(cls, name: str) -> RedissonKeys:
        # Redisson's prefixName: the name goes in braces (one hash slot) unless it has them.
        tagged = name if "{" in name else "{" + name + "}"
        return cls(
            name,
            f"redisson_delay_queue_timeout:{tagged}",
            f"redisson_delay_queue:{tagged}",
            f"redisson_delay_queue_channel:{tagged}",
        )


def redisson_offer_all(url: str, keys: RedissonKeys, due_ms: int, n: int, ordered: bool) -> None:
    """What ``n`` calls of ``RDelayedQueue.offerAsync`` send, pipelined 1,000 at a time."""
    client = redis.Redis.from_url(url)
    offer = client.register_script(OFFER_LUA)
    key_list = [keys.destination, keys.timeout_set, keys.ordering, keys.channel]
    flag = "1" if ordered else "0"
    offer(keys=key_list, args=[due_ms + 10**9, b"warmup00", b"{}", flag])  # loads the script
    client.delete(*key_list[:3])
    for start in range(0, n, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            value = json.dumps(payload(i), separators=(",", ":"))
            offer(keys=key_list, args=[due_ms, os.urandom(8), value, flag], client=pipe)
        pipe.execute()
    client.close()


class RedissonTransfer(threading.Thread):
    """``QueueTransferTask``: moves due members to the destination list, driven by the
    channel's announcements and by the head score each transfer replies."""

    def __init__(self, url: str, keys: RedissonKeys, ordered: bool) -> None:
        super().__init__(name="redisson-transfer", daemon=True)
        self.client = redis.Redis.from_url(url)
        self.keys = keys
        self.flag = "1" if ordered else "0"
        self.script = self.client.register_script(TRANSFER_LUA)
        self.subscribed = threading.Event()
        self.stopping = threading.Event()
        self.timer_ms: int | None = None  # epoch ms of the one pending timer

    def run(self) -> None:
        pubsub = self.client.pubsub()  # type: ignore[no-untyped-call]
        pubsub.subscribe(self.keys.channel)
        while not self.stopping.is_set():
            wait_s = 0.5
            if self.timer_ms is not None:
                wait_s = min(wait_s, max(0.0, (self.timer_ms - now_ms()) / 1000))
            message = pubsub.get_message(timeout=wait_s)
            if message is not None:
                if message["type"] == "subscribe":
                    self.push()  # onSubscribe
                    self.subscribed.set()
                elif message["type"] == "message":
                    self.schedule(int(message["data"]))
            if self.timer_ms is not None and now_ms() >= self.timer_ms:
                self.timer_ms = None
                self.push()
        pubsub.close()
        self.client.close()

    def schedule(self, start_ms: int) -> None:
        """scheduleTask: a new timer replaces the old one; due within 10 ms: transfer now."""
        if start_ms - now_ms() > IMMEDIATE_MS:
            self.timer_ms = start_ms
        else:
            self.timer_ms = None
            self.push()

    def push(self) -> None:
        """pushTask, with its re-scheduling on the reply unrolled into a loop."""
        keys = [self.keys.destination, self.keys.timeout_set, self.keys.ordering]
        while True:
            head = self.script(keys=keys, args=[now_ms(), TRANSFER_BATCH, self.flag])
            if head is None:
                return
            if int(head) - now_ms() > IMMEDIATE_MS:
                self.timer_ms = int(head)
                return


class AsyncRedissonTransfer:
    """:class:`RedissonTransfer` as an asyncio task, for the ``async-redisson-lean`` row."""

    def __init__(self, url: str, keys: RedissonKeys) -> None:
        self.client = aredis.Redis.from_url(url)
        self.keys = keys
        self.script = self.client.register_script(TRANSFER_LUA)
        self.subscribed = asyncio.Event()
        self.stopping = asyncio.Event()
        self.timer_ms: int | None = None

    async def run(self) -> None:
        pubsub = self.client.pubsub()
        await pubsub.subscribe(self.keys.channel)
        while not self.stopping.is_set():
            wait_s = 0.5
            if self.timer_ms is not None:
                wait_s = min(wait_s, max(0.0, (self.timer_ms - now_ms()) / 1000))
            message = await pubsub.get_message(timeout=wait_s)
            if message is not None:
                if message["type"] == "subscribe":
                    await self.push()
                    self.subscribed.set()
                elif message["type"] == "message":
                    await self.schedule(int(message["data"]))
            if self.timer_ms is not None and now_ms() >= self.timer_ms:
                self.timer_ms = None
                await self.push()
        await pubsub.aclose()
        await self.client.aclose()

    async def schedule(self, start_ms: int) -> None:
        if start_ms - now_ms() > IMMEDIATE_MS:
            self.timer_ms = start_ms
        else:
            self.timer_ms = None
            await self.push()

    async def push(self) -> None:
        keys = [self.keys.destination, self.keys.timeout_set, self.keys.ordering]
        while True:
            head = await self.script(keys=keys, args=[now_ms(), TRANSFER_BATCH, "0"])
            if head is None:
                return
            if int(head) - now_ms() > IMMEDIATE_MS:
                self.timer_ms = int(head)
                return


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- consumers (each in its own process) -----------------------------------------------------


class Stopped(BaseException):
    """Raised in a consumer by SIGTERM: the run's cap has passed."""


class Record:
    """What the handler keeps: every ``i`` it saw and when the last one was handled."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen: list[int] = []
        self.distinct: set[int] = set()
        self.first_s: float | None = None
        self.last_s: float | None = None

    def handle(self, task_payload: dict[str, Any]) -> None:
        """The same tiny work in every row; the payload is already decoded."""
        i = task_payload["i"]
        self.seen.append(i)
        self.distinct.add(i)
        self.last_s = time.time()
        if self.first_s is None:
            self.first_s = self.last_s

    @property
    def done(self) -> bool:
        return len(self.distinct) >= self.n


def consume_redisson(url: str, record: Record, ready: Any, ordered: bool) -> None:
    keys = RedissonKeys.of(QUEUE)
    transfer = RedissonTransfer(url, keys, ordered)
    transfer.start()
    transfer.subscribed.wait(10)
    # No read timeout (redis-py 8 defaults to 5 s): a blocking take() waits as long as it takes.
    client = redis.Redis.from_url(url, socket_timeout=None)
    client.ping()
    ready.set()
    try:
        while not record.done:
            popped = client.blpop([keys.destination], 0)  # RBlockingQueue.take()
            if popped is not None:  # never with timeout 0
                record.handle(json.loads(popped[1]))
    finally:
        transfer.stopping.set()
        transfer.join(2)
        client.close()


async def consume_redisson_async(url: str, record: Record, ready: Any) -> None:
    keys = RedissonKeys.of(QUEUE)
    transfer = AsyncRedissonTransfer(url, keys)
    running = asyncio.create_task(transfer.run())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(transfer.subscribed.wait(), 10)
    client = aredis.Redis.from_url(url, socket_timeout=None)
    await client.ping()
    ready.set()
    try:
        while not record.done:
            popped = await client.blpop([keys.destination], 0)
            if popped is not None:
                record.handle(json.loads(popped[1]))
    finally:
        transfer.stopping.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 2)
        await client.aclose()


def at_most_once(row: str) -> bool:
    return "amo-" in row


def consume_sync(url: str, record: Record, ready: Any, how: str) -> None:
    acked = not at_most_once(how)
    how = how.removeprefix("amo-")
    q: DelayQueue[Any] = DelayQueue(QUEUE, url, ack=acked)
    ready.set()
    try:
        if how == "consume":
            # ``with q.consume() as tasks`` where it is a context manager (a break acks the
            # task in hand), else a bare ``for``.
            stream: Any = q.consume()  # type: ignore[attr-defined, unused-ignore]  # newer API
            with (
                stream if hasattr(stream, "__enter__") else contextlib.nullcontext(stream) as tasks
            ):
                for task in tasks:
                    record.handle(task.payload)
                    if record.done:
                        break
            return
        while not record.done:
            if how == "take":
                task = q.take()
            else:
                polled = q.poll(timeout=1.0)
                if polled is None:
                    continue
                task = polled
            record.handle(task.payload)
            if acked:
                task.ack()
    finally:
        q.close()


async def consume_async(url: str, record: Record, ready: Any, how: str) -> None:
    acked = not at_most_once(how)
    how = how.removeprefix("amo-")
    q: AsyncDelayQueue[Any] = AsyncDelayQueue(QUEUE, url, ack=acked)
    ready.set()
    try:
        if how == "consume":
            stream: Any = q.consume()  # type: ignore[attr-defined, unused-ignore]  # newer API
            entered = hasattr(stream, "__aenter__")
            async with stream if entered else contextlib.nullcontext(stream) as tasks:
                async for task in tasks:
                    record.handle(task.payload)
                    if record.done:
                        break
            return
        while not record.done:
            if how == "take":
                task = await q.take()
            else:
                polled = await q.poll(timeout=1.0)
                if polled is None:
                    continue
                task = polled
            record.handle(task.payload)
            if acked:
                await task.ack()
    finally:
        await q.close()


def has_consume(row: str) -> bool:
    return hasattr(AsyncDelayQueue if row.startswith("async-") else DelayQueue, "consume")


def _stop(signum: int, frame: Any) -> None:
    raise Stopped


def consumer_process(row: str, url: str, n: int, out: str, ready: Any) -> None:
    """One consumer: runs until it handled ``n`` distinct tasks or gets SIGTERM; writes what
    it saw to ``out`` (JSON) either way."""
    signal.signal(signal.SIGTERM, _stop)
    if cpu := os.environ.get(CONSUMER_CPU):
        os.sched_setaffinity(0, {int(cpu)})
    record = Record(n)
    cpu_at_ready = time.process_time()
    error = None

    class Ready:  # the CPU clock starts when the consumer is set up and about to wait
        def set(self) -> None:
            nonlocal cpu_at_ready
            cpu_at_ready = time.process_time()
            ready.set()

    try:
        if row in YARDSTICKS:
            consume_redisson(url, record, Ready(), ordered=row == "redisson")
        elif row == ASYNC_YARDSTICK:
            asyncio.run(consume_redisson_async(url, record, Ready()))
        elif row.startswith("async-"):
            asyncio.run(consume_async(url, record, Ready(), row.removeprefix("async-")))
        else:
            consume_sync(url, record, Ready(), row)
    except Stopped:
        pass
    except Exception as exc:  # reported in the row, not lost in a child's stderr
        error = f"{type(exc).__name__}: {exc}"
    cpu_s = time.process_time() - cpu_at_ready
    result = {
        "seen": record.seen,
        "first_s": record.first_s,
        "last_s": record.last_s,
        "cpu_s": cpu_s,
        "error": error,
    }
    Path(out).write_text(json.dumps(result))


# -- Redis counters --------------------------------------------------------------------------


class Counters:
    """INFO commandstats and cpu on one connection; INFO itself is not counted."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)

    def snapshot(self) -> dict[str, float]:
        stats = self.client.info("commandstats")
        cpu = self.client.info("cpu")
        commands = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
        return {
            "commands": float(commands),
            "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            "at": time.time(),
        }

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before[k] for k in before}

    def close(self) -> None:
        self.client.close()


# -- runs ------------------------------------------------------------------------------------


@dataclass
class Consumer:
    """A consumer process and the file it writes its record to."""

    row: str
    url: str
    n: int
    tmp: Path

    def __post_init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.out = self.tmp / f"{self.row}-{time.time_ns()}.json"
        self.ready = ctx.Event()
        self.proc = ctx.Process(
            target=consumer_process, args=(self.row, self.url, self.n, str(self.out), self.ready)
        )
        self.proc.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        if not self.ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"{self.row}: consumer not ready in {timeout:.0f} s")

    def stop(self) -> dict[str, Any] | None:
        """SIGTERM (a no-op if it finished), then its record; None if it wrote none."""
        if self.proc.is_alive():
            self.proc.terminate()  # SIGTERM
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        try:
            return dict(json.loads(self.out.read_text()))
        except (OSError, ValueError):
            return None


class LeadPlanner:
    """How far ahead to put the due instant: enough for the enqueue, from the last speeds."""

    def __init__(self, minimum_s: float) -> None:
        self.minimum_s = minimum_s
        self.rates = {"redisson": 30_000.0, "delayq": 15_000.0}  # tasks/s, first guesses

    def lead_s(self, kind: str, n: int) -> float:
        return max(self.minimum_s, 0.5 + 1.5 * n / self.rates[kind])

    def learn(self, kind: str, n: int, seconds: float) -> None:
        if n >= 1000 and seconds > 0:
            self.rates[kind] = n / seconds


def enqueue(row: str, url: str, n: int, due_ms: int) -> None:
    if row in REDISSON_ROWS:
        redisson_offer_all(url, RedissonKeys.of(QUEUE), due_ms, n, ordered=row == "redisson")
        return
    q: DelayQueue[Any] = DelayQueue(QUEUE, url)
    try:
        q.offer_many([Offer(payload(i), at=due_ms / 1000) for i in range(n)])
    finally:
        q.close()


def run_burst(row: str, url: str, sizes: Sizes, tmp: Path, lead: LeadPlanner) -> dict[str, Any]:
    n = sizes.tasks
    admin = redis.Redis.from_url(url)
    admin.flushall()
    consumer = Consumer(row, url, n, tmp)
    counters = Counters(url)
    try:
        consumer.wait_ready()
        kind = "redisson" if row in REDISSON_ROWS else "delayq"
        started = time.time()
        due_ms = int((started + lead.lead_s(kind, n)) * 1000)
        due_s = due_ms / 1000
        enqueue(row, url, n, due_ms)
        enqueued_at = time.time()
        lead.learn(kind, n, enqueued_at - started)
        time.sleep(max(0.0, due_s - 0.05 - time.time()))
        before = counters.snapshot()
        consumer.proc.join(max(0.0, due_s + sizes.cap_s - time.time()))
        capped = consumer.proc.is_alive()
        record = consumer.stop()
        after = counters.snapshot()
    finally:
        counters.close()
        consumer.stop()
        admin.close()
    if record is None:
        return {"error": "the consumer wrote no record (killed?)"}
    used = Counters.delta(before, after)
    seen = [i for i in record["seen"] if 0 <= i < n]
    distinct = len(set(seen))
    delivered = max(distinct, 1)
    first, last = record["first_s"], record["last_s"]
    seconds = (last - due_s) if last is not None else None
    out: dict[str, Any] = {
        "tasks": n,
        "delivered": distinct,
        "lost": None if capped else n - distinct,  # stopped at the cap: not lost, not yet run
        "pending_at_cap": n - distinct if capped else 0,
        "duplicated": len(seen) - distinct,
        "complete": distinct == n and not capped,
        "seconds": None if seconds is None else round(seconds, 3),
        "per_s": round(distinct / seconds) if seconds and seconds > 0 else None,
        "first_ms": None if first is None else round((first - due_s) * 1000, 2),
        "redis_commands_per_task": round(used["commands"] / delivered, 2),
        "redis_cpu_us_per_task": round(used["cpu_s"] * 1e6 / delivered, 2),
        "client_cpu_us_per_task": round(record["cpu_s"] * 1e6 / delivered, 2),
        "enqueue_s": round(enqueued_at - started, 3),
    }
    if record["error"]:
        out["error"] = record["error"]
    notes = []
    if capped:
        notes.append(f"stopped at the cap, {sizes.cap_s:g} s after the due instant")
    if enqueued_at > due_s:
        notes.append(f"enqueueing ended {enqueued_at - due_s:.2f} s after the due instant")
    if notes:
        out["note"] = "; ".join(notes)
    return out


def run_idle(rows: list[str], sizes: Sizes, tmp: Path) -> dict[str, dict[str, Any]]:
    """Every consumer at once, each waiting on an empty queue of its own server."""
    servers = [EmbeddedRedis().start() for _ in rows]
    consumers: list[Consumer] = []
    counters: list[Counters] = []
    try:
        for row, server in zip(rows, servers, strict=True):
            consumers.append(Consumer(row, server.url, 1, tmp))
        for c in consumers:
            c.wait_ready()
        counters = [Counters(s.url) for s in servers]
        time.sleep(sizes.idle_settle_s)
        befores = [c.snapshot() for c in counters]
        time.sleep(sizes.idle_window_s)
        afters = [c.snapshot() for c in counters]
        alive = [c.proc.is_alive() for c in consumers]
    finally:
        for counter in counters:
            counter.close()
        for c in consumers:
            c.stop()
        for s in servers:
            s.stop()
    out: dict[str, dict[str, Any]] = {}
    for row, before, after, ok in zip(rows, befores, afters, alive, strict=True):
        d = Counters.delta(before, after)
        out[row] = {
            "window_s": round(d["at"], 2),
            "commands_per_s": round(d["commands"] / d["at"], 2),
            "redis_cpu_pct": round(100 * d["cpu_s"] / d["at"], 2),
        }
        if not ok:
            out[row]["error"] = "the consumer exited during the idle window"
    return out


# -- summary ---------------------------------------------------------------------------------


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field by field median (lost, duplicated: the maximum; complete: all of them)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[0].get("error", "no run") if runs else "no run"}
    merged: dict[str, Any] = {}
    for field in good[0]:
        values = [r.get(field) for r in good]
        if field in ("lost", "duplicated", "pending_at_cap"):
            known = [v for v in values if v is not None]
            merged[field] = max(known) if known else None
        elif field == "complete":
            merged[field] = all(values)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            merged[field] = round(statistics.median(v for v in values if v is not None), 3)
        elif field == "note":
            merged[field] = "; ".join(sorted({str(v) for v in values if v}))
    merged["runs"] = len(good)
    if len(good) < len(runs):
        merged["failed_runs"] = len(runs) - len(good)
    return merged


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    """Each delayq row against its yardstick (the faster sync Redisson row; for an ``async-``
    row the asyncio one when it ran), and the idle bar."""
    medians = results["medians"]
    rates = {y: medians[y].get("per_s") for y in REDISSON_ROWS if y in medians}
    rates = {y: r for y, r in rates.items() if r}
    sync = {y: r for y, r in rates.items() if y in YARDSTICKS}
    if not sync:
        return {}
    yardstick = max(sync, key=lambda y: sync[y])
    out: dict[str, Any] = {"yardstick": yardstick, "yardstick_per_s": rates[yardstick], "rows": {}}
    if ASYNC_YARDSTICK in rates:
        out["async_yardstick_per_s"] = rates[ASYNC_YARDSTICK]
    for row, median in medians.items():
        if row in REDISSON_ROWS:
            continue
        rate = median.get("per_s")
        own = (
            ASYNC_YARDSTICK if row.startswith("async-") and ASYNC_YARDSTICK in rates else yardstick
        )
        ratio = round(rate / rates[own], 3) if rate else None
        bar = BAR_RATIO_AT_MOST_ONCE if at_most_once(row) else BAR_RATIO
        entry: dict[str, Any] = {
            "against": own,
            "ratio": ratio,
            "ratio_to_sync": round(rate / rates[yardstick], 3) if rate else None,
            "bar": bar,
            "ratios": {y: round(rate / r, 3) if rate else None for y, r in rates.items()},
            "bar_met": ratio is not None
            and ratio >= bar
            and median.get("complete") is True
            and median.get("lost") == 0,
        }
        idle = results.get("idle", {}).get(row)
        if idle and "commands_per_s" in idle:
            entry["idle_bar_met"] = idle["commands_per_s"] <= BAR_IDLE_COMMANDS_PER_S
        out["rows"][row] = entry
    return out


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int) and not isinstance(value, bool):
        return f"{value:,.{digits}f}"
    return str(value)


def table(results: dict[str, Any]) -> list[str]:
    """The results as a markdown table (also what the console shows)."""
    v = results.get("verdicts", {})
    head = (
        "| row | tasks/s | vs its yardstick | vs the sync yardstick "
        "| bar (acked ≥ 0.85×, amo ≥ 1.0×) | lost | dup | first ms | Redis cmd/task "
        "| Redis CPU µs/task | client CPU µs/task | idle cmd/s (≤ 2) |"
    )
    columns = head.count("|") - 1
    lines = [head, "|" + "---|" * columns]
    for row, median in results["medians"].items():
        idle = results.get("idle", {}).get(row, {})
        idle_cell = _fmt(idle.get("commands_per_s"), 2)
        if "error" in idle:
            idle_cell += f" (error: {idle['error']})"
        if row in REDISSON_ROWS:
            rate, best = median.get("per_s"), v.get("yardstick_per_s")
            to_sync = f"{rate / best:.2f}×" if rate and best else "-"
            ratio = "yardstick" if row in (v.get("yardstick"), ASYNC_YARDSTICK) else to_sync
            to_sync, bar = ("yardstick" if row == v.get("yardstick") else to_sync), ""
        else:
            entry = v.get("rows", {}).get(row, {})
            ratio = _fmt(entry.get("ratio"), 2) + "×" if entry.get("ratio") else "-"
            to_sync = _fmt(entry.get("ratio_to_sync"), 2) + "×" if entry.get("ratio") else "-"
            bar = "-" if not entry else "met" if entry.get("bar_met") else "**missed**"
            if "idle_bar_met" in entry:
                idle_cell += "" if entry["idle_bar_met"] else " **missed**"
        if "error" in median:
            lines.append(f"| {row} | error: {median['error']} |" + " |" * (columns - 2))
            continue
        lines.append(
            f"| {row} | {_fmt(median.get('per_s'))} | {ratio} | {to_sync} | {bar} "
            f"| {_fmt(median.get('lost'))} "
            f"| {_fmt(median.get('duplicated'))} | {_fmt(median.get('first_ms'), 1)} "
            f"| {_fmt(median.get('redis_commands_per_task'), 2)} "
            f"| {_fmt(median.get('redis_cpu_us_per_task'), 1)} "
            f"| {_fmt(median.get('client_cpu_us_per_task'), 1)} | {idle_cell} |"
        )
    for row, note in results.get("skipped", {}).items():
        lines.append(f"| {row} | skipped: {note} |" + " |" * (columns - 2))
    return lines


def markdown(results: dict[str, Any]) -> str:
    m, s = results["machine"], results["sizes"]
    notes = [
        f"- {row}: {median['note']}"
        for row, median in results["medians"].items()
        if median.get("note")
    ]
    return "\n".join(
        [
            "# The plain consumer against a Redisson-style queue (issues #12, #18)",
            "",
            "Generated by `python -m bench.consumer --docs` from `bench/results/consumer.json`;",
            "what each row runs and what the Redisson rows copy from Redisson is in the module's",
            "docstring (`bench/consumer.py`) and [bench/README.md](../bench/README.md).",
            "",
            f"Measured {results['date']} on {m['cpus']} CPUs ({m['platform']}),"
            f" Python {m['python']}, redis-py {m['redis_py']} (hiredis {m['hiredis']}),"
            f" redis-server {m['redis']} on a free port, delayq {m['delayq']} at {m['commit']}."
            f" {s['tasks']:,} tasks with a ~100-byte JSON payload due at one instant, one"
            f" consumer process, Redis and the consumer on {_layout_words(results)};"
            f" medians of {s['repeat']} interleaved rounds; idle:"
            f" {s['idle_window_s']:.0f}-s window on an empty queue.",
            "",
            "```console",
            f"$ {results['command']}",
            "```",
            "",
            *table(results),
            "",
            "Rate = tasks / (last handled − due instant). Ratios are against the faster sync"
            " Redisson row of the same invocation (the sync yardstick) and, for the `async-`"
            " rows, against `async-redisson-lean` (its yardstick when it ran): the lean loop on"
            " `redis.asyncio`, which pays asyncio's cost per round trip as they do. Redis"
            " commands include the calls made inside Lua scripts (`INFO commandstats`).",
            "",
            "The `amo-` rows are the at-most-once queue (`ack=False`): `take()` fetches ahead"
            " what the loop hands out in about 10 ms (at most `fetch_ahead`, 8), in one round"
            " trip, the task leaving Redis when it is fetched; `close()` offers the ones not"
            " handed out again, and a crash loses them (never delivered: at most once).",
            "",
            "The `consume` rows ack every task too, without waiting for the ack: while the"
            " next task is at hand (fetched ahead), the loop writes the ack and goes on, and"
            " reads its reply on its next round trip (the fetch of the next tasks). Redis runs"
            " the ack while the loop handles the next task. An ack that did not reach Redis"
            " (a crash, a lost connection) leaves the task to be delivered again, as any lost"
            " ack does; a lease found lost is logged when the reply is read.",
            "",
            "Why the `take`/`poll` rows trail the lean loop: `ack()` waits for its reply (it"
            " raises `LeaseLost` when the lease was lost), so both cost one round trip per"
            " task, but the lean loop's is a `BLPOP` that removes the task (at-most-once: a"
            " consumer that dies holding it loses it), where delayq's is its ack: one script"
            " that checks the task's lease token and expiry, removes the task from four"
            " structures, counts it and keeps a receipt so that a resend after a lost reply"
            " answers the same (about 10 Redis commands and 17 µs inside Redis per call, of"
            " which 3 µs run any script with the queue's keys and 3 µs write the receipt), the"
            " next due tasks being fetched in the same round trip every few tasks. Where each"
            " round trip crosses cores (the first table, and any Redis on another host) the"
            " wait for the reply dominates both; on one core the work per task does.",
            *(["", *notes] if notes else []),
            "",
            "Every round, tasks/s (the medians above are of these; the machine's load average"
            f" was {_loads(m)}):",
            "",
            *[
                f"- {row}: " + ", ".join(_fmt(r.get("per_s")) for r in results["runs"][row])
                for row in results["medians"]
            ],
            "",
        ]
    )


def _loads(m: dict[str, Any]) -> str:
    start, end = m.get("load_average_at_start"), m.get("load_average_at_end")
    if not start or not end:
        return "not recorded"
    return f"{start[0]:.2f} at the start and {end[0]:.2f} at the end, 1-min, on {m['cpus']} CPUs"


def machine(source_label: str | None = None) -> dict[str, Any]:
    import hiredis

    source = Path(delayq.__file__).resolve().parents[1]  # the src/ directory imported

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=source, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--", "."):
        commit += " with uncommitted changes"
    return {
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],  # others on the box
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis": server_version(find_redis_server()),
        "redis_py": redis.__version__,
        "hiredis": hiredis.__version__,
        "delayq": delayq.__version__,
        "delayq_source": str(source),
        "commit": source_label or commit or f"(not a git tree: {source})",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="5,000 tasks")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument("--repeat", type=int, help="rounds (default 3; smoke 1)")
    parser.add_argument("--tasks", type=int, help="tasks per burst")
    parser.add_argument("--rows", help=f"comma-separated subset of {','.join(ROWS)}")
    parser.add_argument(
        "--layout",
        choices=["apart", "shared", "free"],
        default="apart" if (os.cpu_count() or 1) >= 2 else "free",
        help="Redis and the consumer on two CPUs (default on 2+ CPUs), one, or where they fall;"
        " a shared run writes consumer-shared.json, which the docs page shows beside",
    )
    parser.add_argument(
        "--idle-window", type=float, help="seconds of the idle window (default 10; 0 skips it)"
    )
    parser.add_argument(
        "--source-label",
        help="what the imported delayq source is, when it is not a git tree (e.g. a commit)",
    )
    parser.add_argument("--out", type=Path, help="results directory (default bench/results)")
    parser.add_argument(
        "--docs", type=Path, nargs="?", const=DOCS, help="also write benchmarks-consumer.md there"
    )
    parser.add_argument(
        "--docs-only", action="store_true", help="redraw the docs page from the results file"
    )
    args = parser.parse_args(argv)
    out_dir = args.out or (None if args.quick or args.smoke else RESULTS)
    if args.docs_only:
        saved = json.loads(((args.out or RESULTS) / "consumer.json").read_text())
        write_docs(saved, args.docs or DOCS, args.out or RESULTS)
        return 0

    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.repeat:
        sizes = replace(sizes, repeat=args.repeat)
    if args.tasks:
        sizes = replace(sizes, tasks=args.tasks)
    if args.idle_window is not None:
        sizes = replace(sizes, idle_window_s=args.idle_window)
    wanted = args.rows.split(",") if args.rows else list(ROWS)
    unknown = set(wanted) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    skipped = {
        row: "the queue has no consume() method"
        for row in wanted
        if row.endswith("consume") and not has_consume(row)
    }
    rows = [row for row in wanted if row not in skipped]

    results: dict[str, Any] = {
        "command": " ".join(
            ["python -m bench.consumer", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(args.source_label),
        "sizes": asdict(sizes),
        "rows": rows,
        "skipped": skipped,
        "layout": args.layout,
    }
    cpus = LAYOUTS.get(args.layout)
    if cpus is not None:
        os.environ[CONSUMER_CPU] = str(cpus[1])  # read by each consumer process (spawned)
    print(f"{len(rows)} rows x {sizes.repeat} rounds of {sizes.tasks:,} tasks", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    lead = LeadPlanner(sizes.lead_min_s)
    with tempfile.TemporaryDirectory(prefix="delayq-bench-consumer-") as tmp_name:
        tmp = Path(tmp_name)
        server = EmbeddedRedis().start()
        if cpus is not None:
            os.sched_setaffinity(server._proc.pid, {cpus[0]})  # type: ignore[union-attr]
        try:
            for round_no in range(sizes.repeat):
                # rotated each round, so that no row always follows the same one
                order = rows[round_no % len(rows) :] + rows[: round_no % len(rows)]
                for row in order:
                    try:
                        run = run_burst(row, server.url, sizes, tmp, lead)
                    except Exception as exc:  # one broken row must not lose the others
                        run = {"error": f"{type(exc).__name__}: {exc}"}
                    run["round"] = round_no + 1
                    runs[row].append(run)
                    print(f"  round {round_no + 1} {row:>14}: {_brief(run)}", flush=True)
        finally:
            server.stop()
        if sizes.idle_window_s > 0 and rows:
            results["idle"] = run_idle(rows, sizes, tmp)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["medians"] = {row: median_of(runs[row]) for row in rows}
    results["runs"] = runs
    results["verdicts"] = verdicts(results)
    print()
    print("\n".join(table(results)))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        name = results_name(args.layout)
        (out_dir / name).write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {out_dir / name}")
    if args.docs:
        write_docs(results, args.docs, out_dir)
    return 0


def _brief(run: dict[str, Any]) -> str:
    if "error" in run and "per_s" not in run:
        return f"error: {run['error']}"
    keys = ("per_s", "lost", "duplicated", "redis_commands_per_task", "redis_cpu_us_per_task")
    text = ", ".join(f"{k}={run.get(k)}" for k in keys)
    for extra in ("note", "error"):
        if run.get(extra):
            text += f" ({run[extra]})"
    return text


def write_docs(results: dict[str, Any], docs: Path, results_dir: Path | None = None) -> None:
    """The docs page of ``results``, with the other layout's run beside it when the results
    directory holds one (a shared-core run beside the default, or the other way round)."""
    docs.mkdir(parents=True, exist_ok=True)
    other = None
    if results_dir is not None:
        mine = results_name(results.get("layout", "free"))
        names = [n for n in ("consumer.json", "consumer-shared.json") if n != mine]
        if (results_dir / names[0]).exists():
            other = json.loads((results_dir / names[0]).read_text())
    main, extra = (
        (other, results) if results.get("layout") == "shared" and other else (results, other)
    )
    text = markdown(main)
    if extra is not None:
        text += "\n".join(
            [
                "",
                f"## Redis and the consumer on {_layout_words(extra)}",
                "",
                "```console",
                f"$ {extra['command']}",
                "```",
                "",
                *table(extra),
                "",
                "Every round, tasks/s:",
                "",
                *[
                    f"- {row}: " + ", ".join(_fmt(r.get("per_s")) for r in extra["runs"][row])
                    for row in extra["medians"]
                ],
                "",
            ]
        )
    path = docs / "benchmarks-consumer.md"
    path.write_text(text)
    print(f"wrote {path}")


def _layout_words(results: dict[str, Any]) -> str:
    return {
        "apart": "two CPUs (Redis on CPU 0, the consumer on CPU 1)",
        "shared": "one CPU (both on CPU 1)",
    }.get(results.get("layout", ""), "the CPUs the scheduler chose")


if __name__ == "__main__":
    raise SystemExit(main())

"""The soak's client processes, each recording its history: ``python -m bench.soak.clients
ROLE --url URL --queue Q --prefix P --history DIR --name NAME [...]``.

Roles: ``producer`` (offers with caller ids and retries, dedup keys, cancels, reschedules),
``outbox-producer`` (offers in PostgreSQL transactions, some rolled back), and the consumers
``take`` (a plain take/ack loop), ``consume`` (``queue.consume()``), ``worker`` (the thread
``Worker``) and ``async-worker`` (``AsyncWorker``). Each runs until SIGTERM. The harness
(run.py) starts them, and the nemesis kills, stops and restarts them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import threading
import time
from collections import deque
from typing import Any

from delayq import (
    AsyncDelayQueue,
    AsyncWorker,
    Backoff,
    DelayQueue,
    Durability,
    RedisUnavailable,
    Worker,
)
from delayq.exceptions import DelayqError

from .history import Recorder

SLOW = "slow"  # a payload flag: the take loop holds this task past its lease, on purpose


def _queue_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "prefix": args.prefix,
        "visibility_timeout": args.visibility_timeout,
        "max_attempts": 50,  # the soak looks for loss, not for dead letters from faults
        "retry_backoff": Backoff(base=0.2, max=2.0),  # a lapsed lease comes back soon
        "reconnect_timeout": args.reconnect_timeout,
    }
    if args.fetch_replicas:  # consumers: no task handed out on a lease only the master has
        options["durability"] = Durability(
            replicas=args.fetch_replicas, timeout=2.0, after_fetch=True
        )
    return options


class Stop:
    """SIGTERM sets it; loops check it between operations."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: self.event.set())

    def __bool__(self) -> bool:
        return self.event.is_set()


# -- producers ------------------------------------------------------------------------------


def produce(args: argparse.Namespace, rec: Recorder, stop: Stop) -> None:
    rnd = random.Random(args.seed)
    durability = Durability(replicas=args.replicas, timeout=2.0) if args.replicas else None
    plain = DelayQueue(args.queue, args.url, **_queue_options(args))
    durable = (
        DelayQueue(args.queue, args.url, durability=durability, **_queue_options(args))
        if durability
        else plain
    )
    recent: deque[str] = deque(maxlen=200)  # own offers that may still be waiting
    number = 0
    period = 1.0 / args.rate
    next_at = time.monotonic()
    while not stop:
        next_at += period
        number += 1
        roll = rnd.random()
        try:
            if roll < 0.16 and recent:
                # Every cancel waits for the replicas where offers can: a cancel that returned
                # True must hold (the bar). Reschedules wait as often as offers do.
                use_durable = durability is not None and rnd.random() < args.durable_fraction
                if roll < 0.08:
                    queue = durable if durability is not None else plain
                    _cancel(queue, rec, rnd.choice(recent), durability is not None)
                else:
                    queue = durable if use_durable else plain
                    _reschedule(queue, rec, rnd.choice(recent), rnd.uniform(0.2, 3.0), use_durable)
            else:
                keyed = roll > 0.85
                use_durable = durability is not None and rnd.random() < args.durable_fraction
                task_id = f"{args.name}-{number}"
                delay = rnd.choice((0.0, rnd.uniform(0.05, 4.0), rnd.uniform(0.05, 1.0)))
                key = f"k{rnd.randrange(25)}" if keyed else None
                slow = rnd.random() < args.slow_fraction
                payload = {"n": number, "flag": SLOW if slow else ""}
                queue = durable if use_durable else plain
                if _offer(queue, rec, task_id, payload, delay, key,
                          args.durable_all or use_durable):  # fmt: skip
                    recent.append(task_id)
        except Exception:
            pass
        pause = next_at - time.monotonic()
        if pause > 0:
            stop.event.wait(pause)
        else:
            next_at = time.monotonic()  # behind (a fault): do not burst to catch up
    plain.close()
    if durable is not plain:
        durable.close()


def _offer(
    queue: DelayQueue, rec: Recorder, task_id: str, payload: Any, delay: float,
    key: str | None, durable: bool,
) -> bool:  # fmt: skip
    """Offer with the caller's id and retry an unknown outcome with the same id: a resend
    is a no-op if the first one landed (delayq's idempotent offer)."""
    for _ in range(3):
        try:
            with rec.operation("offer", id=task_id, key=key, delay_ms=int(delay * 1000),
                               durable=durable) as out:  # fmt: skip
                got = queue.offer(payload, delay, id=task_id, key=key)
                out["id"] = str(got)
                out["outcome"] = str(got.outcome)
            return str(got) == task_id
        except (RedisUnavailable, OSError):
            continue
    return False


def _cancel(queue: DelayQueue, rec: Recorder, task_id: str, durable: bool) -> None:
    with rec.operation("cancel", id=task_id, durable=durable) as out:
        out["cancelled"] = queue.cancel(task_id)


def _reschedule(
    queue: DelayQueue, rec: Recorder, task_id: str, delay: float, durable: bool
) -> None:
    with rec.operation(
        "reschedule", id=task_id, delay_ms=int(delay * 1000), durable=durable
    ) as out:
        out["moved"] = queue.reschedule(task_id, delay)


def produce_outbox(args: argparse.Namespace, rec: Recorder, stop: Stop) -> None:
    """Offer through the outbox, one to three tasks a transaction, one in five rolled back."""
    import psycopg

    from delayq.outbox import Outbox

    rnd = random.Random(args.seed)
    outbox = Outbox(args.dsn, prefix=args.prefix, table=args.table)
    conn: Any = None
    number = 0
    while not stop:
        stop.event.wait(1.0 / args.rate)
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(args.dsn, connect_timeout=3)
            commit = rnd.random() < 0.8
            ids: list[str] = []
            op = rec.invoke("outbox", commit=commit)
            try:
                with conn.transaction(force_rollback=not commit):
                    for _ in range(rnd.randint(1, 3)):
                        number += 1
                        delay = rnd.uniform(0.0, 2.0)
                        ids.append(outbox.offer(conn, args.queue, {"n": number}, delay))
            except Exception as exc:
                # Before the COMMIT was sent nothing can have committed; after, who knows.
                rec.complete(op, "outbox", "unknown", ids=ids, commit=commit, error=repr(exc)[:200])
                raise
            rec.complete(op, "outbox", "ok", ids=ids, commit=commit)
        except Exception:
            conn = None
    if conn is not None:
        conn.close()


# -- consumers ------------------------------------------------------------------------------


def _delivered(rec: Recorder, task: Any, number: int | None = None) -> None:
    value = {
        "id": task.id, "due_ms": task.due_ms, "delivered_ms": task.delivered_ms,
        "attempts": task.attempts, "token": task.lease_token or "", "key": task.key,
    }  # fmt: skip
    if number is None:
        rec.info("deliver", **value)  # a worker's or consume()'s: no fetch of our own to time
    else:
        rec.complete(number, "fetch", "ok", **value)


def _plan(task: Any, rnd: random.Random, slow_s: float) -> tuple[float, bool, bool]:
    """(seconds to work, slow on purpose, raise): the handler's behaviour for this task."""
    payload = task.payload if isinstance(task.payload, dict) else {}
    if payload.get("flag") == SLOW and task.attempts == 1:
        return slow_s, True, False
    return rnd.uniform(0, 0.01), False, rnd.random() < 0.02


def consume_take(args: argparse.Namespace, rec: Recorder, stop: Stop) -> None:
    rnd = random.Random(args.seed)
    # fetch_ahead=0: each take() is the fetch that leased the task, so the take's invoke is
    # a true lower bound of the delivery (the checker's fencing-order check uses it).
    queue = DelayQueue(args.queue, args.url, fetch_ahead=0, **_queue_options(args))
    while not stop:
        number = rec.invoke("fetch")
        try:
            task = queue.poll(1.0)
        except Exception as exc:
            rec.complete(number, "fetch", "fail", error=repr(exc)[:200])
            stop.event.wait(0.2)
            continue
        if task is None:
            rec.complete(number, "fetch", "ok")
            continue
        _delivered(rec, task, number)
        # Past the lease, its backoff (0.2 s) and the next fetch's look: someone else has it.
        work, slow, fails = _plan(task, rnd, args.visibility_timeout * 1.5 + 1.0)
        time.sleep(work)
        rec.info("handled", id=task.id, token=task.lease_token, slow=slow, raised=fails)
        try:
            if fails:
                with rec.operation("nack", id=task.id, token=task.lease_token):
                    queue.retry(task, 0.1, error="soak: planned failure")
            else:
                with rec.operation("ack", id=task.id, token=task.lease_token):
                    queue.ack(task)
        except Exception:
            pass
    queue.close()


def consume_iter(args: argparse.Namespace, rec: Recorder, stop: Stop) -> None:
    rnd = random.Random(args.seed)
    queue = DelayQueue(args.queue, args.url, **_queue_options(args))
    while not stop:
        try:
            with queue.consume(timeout=1.0) as tasks:
                for task in tasks:
                    _delivered(rec, task)
                    time.sleep(rnd.uniform(0, 0.01))
                    rec.info("handled", id=task.id, token=task.lease_token)
                    if stop:
                        break
        except (DelayqError, OSError):  # an outage, a refused write (maxmemory): back off
            stop.event.wait(0.2)
    queue.close()


def consume_worker(args: argparse.Namespace, rec: Recorder, stop: Stop) -> None:
    rnd = random.Random(args.seed)
    queue = DelayQueue(args.queue, args.url, **_queue_options(args))

    def handle(task: Any) -> None:
        _delivered(rec, task)
        work, _, fails = _plan(task, rnd, 0)
        time.sleep(work)
        rec.info("handled", id=task.id, token=task.lease_token, raised=fails)
        if fails:
            raise RuntimeError("soak: planned failure")

    worker = Worker(queue, handle, concurrency=4, grace=5)
    threading.Thread(target=lambda: (stop.event.wait(), worker.stop()), daemon=True).start()
    worker.run()
    queue.close()


def consume_async_worker(args: argparse.Namespace, rec: Recorder, stop: Stop) -> None:
    rnd = random.Random(args.seed)

    async def main() -> None:
        queue = AsyncDelayQueue(args.queue, args.url, **_queue_options(args))

        async def handle(task: Any) -> None:
            _delivered(rec, task)
            work, _, fails = _plan(task, rnd, 0)
            await asyncio.sleep(work)
            rec.info("handled", id=task.id, token=task.lease_token, raised=fails)
            if fails:
                raise RuntimeError("soak: planned failure")

        worker = AsyncWorker(queue, handle, concurrency=8, grace=5)
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=lambda: (stop.event.wait(), loop.call_soon_threadsafe(worker.stop)),
            daemon=True,
        ).start()
        await worker.run()
        await queue.close()

    asyncio.run(main())


ROLES = {
    "producer": produce,
    "outbox-producer": produce_outbox,
    "take": consume_take,
    "consume": consume_iter,
    "worker": consume_worker,
    "async-worker": consume_async_worker,
}


def _clock_control(skew_dir: str, base: str) -> None:
    """SIGUSR1 makes this process read its clock offset (seconds) from ``skew_dir/base``:
    the nemesis's client clock jump. Every wall-clock read of delayq goes through
    ``time.time``/``time.time_ns`` (libfaketime cannot be used: version 0.9.10 jumps the
    monotonic clock with the wall clock, or fails nanosleep when told not to)."""
    real_time, real_time_ns = time.time, time.time_ns
    offset = [0.0]

    def reread(*_: Any) -> None:
        try:
            offset[0] = float(open(f"{skew_dir}/{base}").read())  # noqa: SIM115
        except (OSError, ValueError):
            offset[0] = 0.0

    time.time = lambda: real_time() + offset[0]  # type: ignore[assignment]
    time.time_ns = lambda: real_time_ns() + int(offset[0] * 1e9)  # type: ignore[assignment]
    signal.signal(signal.SIGUSR1, reread)
    reread()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak.clients")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", default="soak")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=20.0, help="producer operations/s")
    parser.add_argument("--visibility-timeout", type=float, default=3.0)
    parser.add_argument("--reconnect-timeout", type=float, default=30.0)
    parser.add_argument("--slow-fraction", type=float, default=0.01)
    parser.add_argument("--replicas", type=int, default=0, help="Durability(replicas=N) offers")
    parser.add_argument("--durable-fraction", type=float, default=0.5)
    parser.add_argument("--fetch-replicas", type=int, default=0,
                        help="consumers: Durability(replicas=N, after_fetch=True)")  # fmt: skip
    parser.add_argument("--durable-all", action="store_true", help="appendfsync always")
    parser.add_argument("--dsn", default="")
    parser.add_argument("--table", default="delayq_outbox")
    parser.add_argument("--skew-dir", default="")
    args = parser.parse_args(argv)
    stop = Stop()
    if args.skew_dir:
        _clock_control(args.skew_dir, args.name.split("#")[0])
    rec = Recorder(args.history, args.name)
    rec.info("start", role=args.role)
    try:
        ROLES[args.role](args, rec, stop)
    finally:
        rec.info("exit", role=args.role)
        rec.close()


if __name__ == "__main__":
    main()

"""Sharded queues on a Redis Cluster, durable offers: issue #10's bars (``-m bench.cluster``).

```console
$ make bench-cluster                           # = .venv/bin/python -m bench.cluster, ~6 min
$ .venv/bin/python -m bench.cluster --quick    # small sizes (a 50,000-task burst), ~1 min
$ .venv/bin/python -m bench.cluster --only spread,durable --out /tmp/cluster.json
```

Every server is started here on free ports of 127.0.0.1 and stopped at the end: a cluster of
3 masters (``EmbeddedCluster``) for the sharded scenarios, a standalone master with one replica
for the durable offers. The queue has ``shards=16``; each worker is ONE ``AsyncWorker`` in a
process of its own with a no-op handler that records what it saw (concurrency 8, the default,
except in the bursts: ``--concurrency``, 64 by default as in bench/worker.py's drain).
Scenarios (bars in brackets):

``durable``
    Offers/s one by one and with ``offer_many`` (1,000 tasks a call), with
    ``Durability(replicas=1)`` and without, rounds alternated in one run, on master + replica.
``spread``
    A mixed load (one-by-one offers, a quarter with dedup keys, bulk offers, cancels, stats)
    while a worker consumes with acks; each master's share of the queue's Redis calls from
    ``INFO commandstats`` (before/after diff, the harness's INFO calls left out; the commands
    that scripts run are counted, as INFO counts them, and the EVALSHA calls alone too).
    [every master 25%..42%] Run for two names: "orders" (its shards fall 5/5/6 on the
    masters) and "promo" (4/6/6); and the layouts of 2,000 names, computed. Also each
    master's Redis CPU per task (``INFO cpu``) under this one-by-one load.
``burst``
    1,000,000 tasks due at one instant (``offer_many`` ahead of it, the worker running),
    drained by the worker: tasks/s from the due instant to the last handler start, lost,
    duplicated, the worker's CPU per task; Redis CPU per task per master from the first offer
    to the last ack. [>= 20,000 tasks/s, 0 lost, 0 duplicated]
``steady``
    2,000 tasks due evenly over 10 s (offered one by one, due from 2 s on), one worker;
    lateness = ``task.delivered_ms - task.due_ms`` (the server's clock), read in the handler.
    [p99 <= 10 ms]
``control``
    The steady scenario and a 100,000-task burst on a plain queue of one standalone Redis,
    right after: what the machine, loaded as it is at that moment, does without sharding.

Each scenario records the machine's 1-minute load average before and after it: this is a
shared 2-core machine, and other work there slows the servers and the worker alike.
``bench/results/cluster.json`` gets every figure, and the projection of a 10-master cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, Durability, Offer
from delayq._core import sharding
from delayq._core.keys import QueueKeys
from delayq.embedded import EmbeddedCluster, EmbeddedRedis, find_redis_server

RESULTS = Path(__file__).parent / "results" / "cluster.json"
PAYLOAD = {"order_id": 123456, "user": "someone@example.com"}
SHARDS = 16
QUEUE = "promo"
# How long a worker process may run before it gives up (a bound on every scenario).
WORKER_CAP_S = 240.0
ONE_CORE_US = 1_000_000  # one Redis main thread: a second of CPU per second, at most


@dataclass(frozen=True)
class Sizes:
    durable_one: int = 3_000
    durable_bulk: int = 50_000
    durable_rounds: int = 5
    spread_n: int = 20_000
    burst_n: int = 1_000_000
    steady_n: int = 2_000
    steady_spread_s: float = 10.0


FULL = Sizes()
QUICK = Sizes(
    durable_one=1_000, durable_bulk=10_000, durable_rounds=1, spread_n=4_000, burst_n=50_000,
    steady_n=500, steady_spread_s=4.0,
)  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else math.nan


# -- the worker process ----------------------------------------------------------------------


def _worker_process(
    url: str, name: str, shards: int, concurrency: int, stop_after: int, out_path: str, ready: Any
) -> None:
    asyncio.run(_work(url, name, shards, concurrency, stop_after, out_path, ready))


async def _work(
    url: str, name: str, shards: int, concurrency: int, stop_after: int, out_path: str, ready: Any
) -> None:
    """One AsyncWorker at its defaults until it has handled ``stop_after`` tasks (or the cap);
    then write what the handler saw to ``out_path``."""
    queue = AsyncDelayQueue(name, url, shards=shards) if shards else AsyncDelayQueue(name, url)
    await queue.stats()  # connected (and the shard count checked) before anything is due
    seen: list[str] = []
    lateness_ms: list[int] = []
    starts: list[float] = []
    cpu: list[float] = []  # this process's CPU time at the first and the last task

    async def handler(task: Any) -> None:
        now = time.time()
        if not starts:
            starts.append(now)
            cpu.append(time.process_time())
        seen.append(task.id)
        lateness_ms.append(task.delivered_ms - task.due_ms)
        if len(seen) >= stop_after:
            starts.append(now)
            cpu.append(time.process_time())
            worker.stop()

    worker = AsyncWorker(queue, handler, concurrency=concurrency, handle_signals=False)
    cap = asyncio.get_running_loop().call_later(WORKER_CAP_S, worker.stop)
    ready.set()
    await worker.run()
    cap.cancel()
    await queue.close()
    first = starts[0] if starts else None
    last = starts[-1] if len(starts) > 1 else None
    cpu_s = cpu[-1] - cpu[0] if len(cpu) > 1 else None
    Path(out_path).write_text(
        json.dumps(
            {"ids": seen, "lateness_ms": lateness_ms, "first": first, "last": last, "cpu_s": cpu_s}
        )
    )


class WorkerProcess:
    """A spawned worker process (as in production: its own interpreter and event loop)."""

    def __init__(
        self,
        url: str,
        stop_after: int,
        name: str = QUEUE,
        shards: int = SHARDS,
        concurrency: int = 8,
    ) -> None:
        ctx = mp.get_context("spawn")
        fd, self.out_path = tempfile.mkstemp(prefix="delayq-bench-", suffix=".json")
        os.close(fd)
        ready = ctx.Event()
        args = (url, name, shards, concurrency, stop_after, self.out_path, ready)
        self.proc = ctx.Process(target=_worker_process, args=args, daemon=True)
        self.proc.start()
        self.pid = self.proc.pid
        if not ready.wait(60):
            self.proc.kill()
            raise RuntimeError("the worker process did not start")

    def result(self, timeout: float) -> dict[str, Any]:
        """What the worker saw, once it stopped (by itself, or killed at ``timeout``)."""
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
            raise RuntimeError(f"the worker did not finish in {timeout:.0f} s")
        try:
            return dict(json.loads(Path(self.out_path).read_text()))
        finally:
            os.unlink(self.out_path)


def verdict(ids: list[str], handled: list[str]) -> dict[str, int]:
    unique = set(handled)
    return {
        "handled": len(handled),
        "lost": len(set(ids) - unique),
        "duplicated": len(handled) - len(unique),
    }


# -- Redis counters per master -----------------------------------------------------------------


class Masters:
    """INFO readings of every master of the cluster, and which master holds which shard."""

    def __init__(self, cluster: EmbeddedCluster) -> None:
        self.names = [f"127.0.0.1:{node.port}" for node in cluster.nodes]
        self.clients = {
            f"127.0.0.1:{node.port}": redis.Redis(port=node.port) for node in cluster.nodes
        }

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def shard_masters(self, url: str, name: str = QUEUE) -> list[str]:
        """The master of each shard of queue ``name``, in shard order."""
        port = int(url.rsplit(":", 1)[1])
        client = RedisCluster(host="127.0.0.1", port=port)
        try:
            subs = [QueueKeys("dq", sub) for sub in sharding.shard_names(name, SHARDS)]
            return [client.get_node_from_key(keys.all[0]).name for keys in subs]
        finally:
            client.close()

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per master: calls per command, ``usec:<command>`` (its time, a script's including
        the commands it runs) and ``_cpu_s`` (the server's user + system CPU)."""
        out: dict[str, dict[str, float]] = {}
        for name, client in self.clients.items():
            row: dict[str, float] = {}
            for key, value in client.info("commandstats").items():
                command = key.removeprefix("cmdstat_")
                row[command] = float(value["calls"])
                row[f"usec:{command}"] = float(value["usec"])
            cpu = client.info("cpu")
            row["_cpu_s"] = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
            out[name] = row
        return out

    @staticmethod
    def delta(
        before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
    ) -> dict[str, dict[str, float]]:
        """after - before, without the harness's own INFO calls."""
        return {
            name: {
                k: v - before[name].get(k, 0.0)
                for k, v in after[name].items()
                if k not in ("info", "usec:info") and v - before[name].get(k, 0.0)
            }
            for name in after
        }


def _calls(row: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items() if not k.startswith(("usec:", "_"))}


def spread_of(delta: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Each master's share of all the queue's calls (the commands its scripts run counted,
    as INFO counts them) and of its script calls alone; what its script calls cost."""
    calls = {name: _calls(d) for name, d in delta.items()}
    totals = {name: sum(c.values()) for name, c in calls.items()}
    scripts = {name: c.get("evalsha", 0.0) + c.get("eval", 0.0) for name, c in calls.items()}
    every, evals = sum(totals.values()) or 1.0, sum(scripts.values()) or 1.0
    out = {}
    for name, d in delta.items():
        usec = d.get("usec:evalsha", 0.0) + d.get("usec:eval", 0.0)
        out[name] = {
            "calls": int(totals[name]),
            "share_pct": round(100 * totals[name] / every, 1),
            "evalsha": int(scripts[name]),
            "evalsha_share_pct": round(100 * scripts[name] / evals, 1),
            "usec_per_evalsha": round(usec / scripts[name], 1) if scripts[name] else None,
            "top_commands": dict(
                sorted(((k, int(v)) for k, v in calls[name].items()), key=lambda kv: -kv[1])[:6]
            ),
        }
    return out


def cpu_per_task(
    delta: dict[str, dict[str, float]],
    idle_cpu_s_per_s: dict[str, float],
    seconds: float,
    tasks_per_master: dict[str, int],
) -> dict[str, Any]:
    """Redis CPU per task on each master: its CPU over the window, less what it spends idle
    (cluster bus, serverCron) in as long, over the tasks of its shards."""
    out = {}
    for name, d in delta.items():
        tasks = tasks_per_master.get(name, 0)
        raw_us = d.get("_cpu_s", 0.0) * 1e6
        net_us = max(0.0, raw_us - idle_cpu_s_per_s[name] * seconds * 1e6)
        out[name] = {
            "tasks": tasks,
            "cpu_ms": round(raw_us / 1000, 1),
            "idle_cpu_ms": round(idle_cpu_s_per_s[name] * seconds * 1000, 1),
            "cpu_us_per_task": round(net_us / tasks, 2) if tasks else None,
        }
    return out


def tasks_per_master(shard_masters: list[str], acked_per_shard: list[int]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for master, acked in zip(shard_masters, acked_per_shard, strict=True):
        counts[master] += acked
    return dict(counts)


def idle_rate(masters: Masters, seconds: float = 3.0) -> dict[str, float]:
    """Each master's CPU per second with no client load (its cluster bus and cron)."""
    before = masters.snapshot()
    time.sleep(seconds)
    after = masters.snapshot()
    return {n: (after[n]["_cpu_s"] - before[n]["_cpu_s"]) / seconds for n in after}


def acked_per_shard(url: str, name: str = QUEUE) -> list[int]:
    with DelayQueue(name, url, shards=SHARDS) as q:
        stats = q.stats()
    return [shard.counters.get("acked", 0) for shard in stats.shards]


def reset(cluster: EmbeddedCluster) -> None:
    """An empty cluster between scenarios (each master flushed)."""
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as client:
            client.flushall()


# -- 1. durable offers ---------------------------------------------------------------------------


def _offer_rates(url: str, name: str, durability: Durability | None, s: Sizes) -> dict[str, Any]:
    with DelayQueue(name, url, durability=durability) as q:
        q.offer(PAYLOAD, delay=600)  # connected and registered before the clock starts
        start = time.perf_counter()
        for _ in range(s.durable_one):
            q.offer(PAYLOAD, delay=600)
        one = s.durable_one / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(0, s.durable_bulk, 1000):
            q.offer_many([(PAYLOAD, 600)] * 1000)
        bulk = s.durable_bulk / (time.perf_counter() - start)
    return {"one_by_one_per_s": one, "bulk_per_s": bulk}


def _wait_caught_up(master_port: int, replica_port: int, timeout: float = 15.0) -> None:
    with redis.Redis(port=master_port) as m, redis.Redis(port=replica_port) as rep:
        deadline = time.monotonic() + timeout
        while True:
            wrote = m.info("replication")["master_repl_offset"]
            if rep.info("replication")["slave_repl_offset"] >= wrote:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replica did not catch up in {timeout:g} s")
            time.sleep(0.01)


def bench_durable(binary: str, s: Sizes) -> dict[str, Any]:
    master = EmbeddedRedis(binary).start()
    replica = EmbeddedRedis(binary, extra_args=["--replicaof", "127.0.0.1", str(master.port)])
    try:
        replica.start()
        with redis.Redis(port=replica.port) as client:
            deadline = time.monotonic() + 15
            while client.info("replication").get("master_link_status") != "up":
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not sync in 15 s")
                time.sleep(0.05)
        runs: dict[str, list[dict[str, Any]]] = {"plain": [], "durable": []}
        for r in range(s.durable_rounds):
            # Alternated, so that a slow moment of the machine hits both alike.
            for mode in ("plain", "durable") if r % 2 == 0 else ("durable", "plain"):
                durability = Durability(replicas=1, timeout=1.0) if mode == "durable" else None
                runs[mode].append(_offer_rates(master.url, f"dur-{mode}-{r}", durability, s))
                # Each round starts with the replica caught up, so that its first durable
                # offers do not wait for the replication of the round before.
                _wait_caught_up(master.port, replica.port)
        with redis.Redis(port=master.port) as m, redis.Redis(port=replica.port) as rep:
            deadline = time.monotonic() + 10
            while rep.dbsize() != m.dbsize() and time.monotonic() < deadline:
                time.sleep(0.05)
            copied = rep.dbsize() == m.dbsize()
    finally:
        replica.stop()
        master.stop()
    out: dict[str, Any] = {
        "setup": "standalone master + 1 replica (redis://), sync DelayQueue, "
        "Durability(replicas=1, timeout=1.0); offer_many with 1,000 tasks a call",
        "rounds": s.durable_rounds,
        "replica_caught_up": copied,
    }
    for mode, rows in runs.items():
        out[mode] = {
            k: round(statistics.median(row[k] for row in rows)) for k in rows[0]
        }  # fmt: skip
    for k in ("one_by_one_per_s", "bulk_per_s"):
        out[f"{k.removesuffix('_per_s')}_ratio"] = round(out["durable"][k] / out["plain"][k], 2)
    return out


# -- 2. spread under a mixed load ----------------------------------------------------------------


async def _mixed_load(url: str, name: str, n: int) -> list[str]:
    """``n`` tasks due within 2 s: half one by one (a quarter of those with dedup keys), half
    in bulk; plus cancelled offers and stats reads. Returns the ids that must be handled."""
    ids: list[str] = []
    q = AsyncDelayQueue(name, url, shards=SHARDS)
    try:
        half = n // 2
        for i in range(half):
            delay = (i % 200) / 100  # 0..2 s
            if i % 4 == 0:
                ids.append(await q.offer(PAYLOAD, delay=delay, key=f"order-{i}"))
            else:
                ids.append(await q.offer(PAYLOAD, delay=delay))
            if i % 10 == 0:  # an order paid in time: its timeout cancelled
                assert await q.cancel(await q.offer(PAYLOAD, delay=600))
            if i % 500 == 0:
                await q.stats()
        for first in range(half, n, 800):
            size = min(800, n - first)
            ids += await q.offer_many([(PAYLOAD, (k % 200) / 100) for k in range(size)])
    finally:
        await q.close()
    return ids


def bench_spread(url: str, cluster: EmbeddedCluster, s: Sizes, name: str) -> dict[str, Any]:
    masters = Masters(cluster)
    try:
        shard_masters = masters.shard_masters(url, name)
        idle = idle_rate(masters)
        before = masters.snapshot()
        start = time.perf_counter()
        worker = WorkerProcess(url, s.spread_n, name)
        ids = asyncio.run(_mixed_load(url, name, s.spread_n))
        seen = worker.result(timeout=WORKER_CAP_S + 30)
        seconds = time.perf_counter() - start
        after = masters.snapshot()
        delta = Masters.delta(before, after)
        per_master = tasks_per_master(shard_masters, acked_per_shard(url, name))
        spread = spread_of(delta)
        shares = [row["share_pct"] for row in spread.values()]
        return {
            "queue": name,
            "tasks": s.spread_n,
            "seconds": round(seconds, 2),
            **verdict(ids, seen["ids"]),
            "shards_per_master": dict(Counter(shard_masters)),
            "masters": spread,
            "min_share_pct": min(shares),
            "max_share_pct": max(shares),
            "bar_met": all(25 <= x <= 42 for x in shares),
            "cpu": cpu_per_task(delta, idle, seconds, per_master),
        }
    finally:
        masters.close()


def slot_layouts(cluster: EmbeddedCluster, names: int = 2_000) -> dict[str, Any]:
    """How the 16 shards of ``names`` queue names fall on this cluster's masters (pure: the
    shards' slots against CLUSTER SLOTS), and how many names leave a master only 4 of 16
    shards (25%: the bar's edge, which the load's own unevenness then crosses)."""
    with redis.Redis(port=cluster.nodes[0].port) as client:
        ranges = [
            (int(r[0]), int(r[1]), int(r[2][1])) for r in client.execute_command("CLUSTER SLOTS")
        ]

    def owner(slot: int) -> int:
        return next(port for low, high, port in ranges if low <= slot <= high)

    layouts: Counter[str] = Counter()
    under = 0
    for i in range(names):
        counts = Counter(owner(sharding.key_slot(n)) for n in sharding.shard_names(f"q{i}", SHARDS))
        split = sorted(counts.get(port, 0) for _, _, port in ranges)
        layouts["/".join(map(str, split))] += 1
        under += min(split) * 100 / SHARDS <= 25
    return {
        "names": names,
        "shards_per_master": dict(layouts.most_common()),
        "names_with_a_master_at_25pct_or_less": under,
    }


def bench_spreads(url: str, cluster: EmbeddedCluster, s: Sizes) -> dict[str, Any]:
    """The spread for two queue names: the issue's own "orders" (its 16 shards fall 5/5/6 on
    3 masters) and "promo" (whose shards fall 4/6/6), and over many names."""
    out: dict[str, Any] = {}
    for name in ("orders", "promo"):
        reset(cluster)
        out[name] = bench_spread(url, cluster, s, name)
    out["layouts"] = slot_layouts(cluster)
    out["bar_met"] = all(out[name]["bar_met"] for name in ("orders", "promo"))
    return out


# -- 3. the burst --------------------------------------------------------------------------------


def _enqueue_rate(url: str) -> float:
    """Tasks/s of offer_many on this cluster, from a throwaway queue (purged afterwards)."""
    with DelayQueue("probe", url, shards=SHARDS) as q:
        q.offer_many([(PAYLOAD, 3600)] * 1000)
        start = time.perf_counter()
        q.offer_many([Offer(PAYLOAD, at=time.time() + 3600) for _ in range(20_000)])
        rate = 20_000 / (time.perf_counter() - start)
        q.purge(["delayed"])
    return rate


def bench_burst(url: str, cluster: EmbeddedCluster, s: Sizes, concurrency: int) -> dict[str, Any]:
    n = s.burst_n
    masters = Masters(cluster)
    try:
        shard_masters = masters.shard_masters(url)
        rate = _enqueue_rate(url)
        idle = idle_rate(masters)
        worker = WorkerProcess(url, n, concurrency=concurrency)
        before = masters.snapshot()
        start = time.perf_counter()
        enqueue_from = time.time()
        due = enqueue_from + 1.5 * n / rate + 2.0
        ids: list[str] = []
        with DelayQueue(QUEUE, url, shards=SHARDS) as q:
            for first in range(0, n, 16_000):
                size = min(16_000, n - first)
                ids += q.offer_many([Offer(PAYLOAD, at=due) for _ in range(size)])
        enqueued_by = time.time()
        seen = worker.result(timeout=WORKER_CAP_S + 30)
        seconds = time.perf_counter() - start
        after = masters.snapshot()
        delta = Masters.delta(before, after)
        acked = acked_per_shard(url)
        per_master = tasks_per_master(shard_masters, acked)
    finally:
        masters.close()
    got = verdict(ids, seen["ids"])
    last = seen["last"]
    drain_s = (last - due) if last is not None else math.nan
    worker_cpu_us = (seen["cpu_s"] or math.nan) * 1e6 / max(1, got["handled"])
    commands = sum(sum(_calls(d).values()) for d in delta.values())
    evalsha = sum(_calls(d).get("evalsha", 0.0) for d in delta.values())
    out = {
        "tasks": n,
        "worker": f"one AsyncWorker process, concurrency {concurrency} (prefetch the "
        "default: 4 x concurrency), no-op handler",
        "enqueue_per_s": round(n / (enqueued_by - enqueue_from)),
        "due_after_enqueue_s": round(due - enqueued_by, 2),
        "drain_s": round(drain_s, 2),
        "per_s": round(n / drain_s) if last is not None else 0,
        # The worker's own CPU per task, which other work on the machine does not change:
        # the rate it drains at with a core to itself (Redis on other cores) is 1 s / that.
        "worker_cpu_us_per_task": round(worker_cpu_us, 1),
        "per_s_with_a_free_core": round(1e6 / worker_cpu_us) if worker_cpu_us > 0 else None,
        **got,
        "acked_in_redis": sum(acked),
        "acked_per_shard": acked,
        "redis_commands_per_task": round(commands / max(1, got["handled"]), 2),
        "evalsha_per_task": round(evalsha / max(1, got["handled"]), 3),
        "cpu": cpu_per_task(delta, idle, seconds, per_master),
    }
    out["bar_met"] = out["per_s"] >= 20_000 and got["lost"] == 0 and got["duplicated"] == 0
    if enqueued_by > due:
        out["note"] = f"enqueueing ended {enqueued_by - due:.2f} s after the due instant"
    return out


# -- 4. steady lateness --------------------------------------------------------------------------


def bench_steady(url: str, s: Sizes, shards: int = SHARDS) -> dict[str, Any]:
    """``shards=0``: a plain queue (the control)."""
    worker = WorkerProcess(url, s.steady_n, QUEUE, shards)
    ids: list[str] = []
    with DelayQueue(QUEUE, url, shards=shards) if shards else DelayQueue(QUEUE, url) as q:
        first_due = time.time() + 2.0
        for i in range(s.steady_n):
            ids.append(q.offer(PAYLOAD, at=first_due + s.steady_spread_s * i / s.steady_n))
        offered_by = time.time()
    seen = worker.result(timeout=s.steady_spread_s + 60)
    late = [float(x) for x in seen["lateness_ms"]]
    out = {
        "tasks": s.steady_n,
        "spread_s": s.steady_spread_s,
        "offered_ahead_s": round(first_due - offered_by, 2),
        **verdict(ids, seen["ids"]),
        "early": sum(1 for x in late if x < 0),
        "p50_ms": pct(late, 0.50),
        "p90_ms": pct(late, 0.90),
        "p99_ms": pct(late, 0.99),
        "max_ms": max(late, default=math.nan),
    }
    out["bar_met"] = out["p99_ms"] <= 10 and out["lost"] == 0
    return out


# -- 5. the control: one plain queue on one Redis, at the same moment -----------------------------


def bench_control(binary: str, s: Sizes, concurrency: int) -> dict[str, Any]:
    """The steady and (a tenth of) the burst on a plain queue of a standalone Redis, right
    after the cluster's: how this machine, as loaded as it is now, does without sharding."""
    n = max(10_000, s.burst_n // 10)
    with EmbeddedRedis(binary) as server:
        steady = bench_steady(server.url, s, shards=0)
        worker = WorkerProcess(server.url, n, "control-burst", 0, concurrency)
        with DelayQueue("control-burst", server.url) as q:
            due = time.time() + 2.0 + n / 20_000
            ids: list[str] = []
            for first in range(0, n, 16_000):
                size = min(16_000, n - first)
                ids += q.offer_many([Offer(PAYLOAD, at=due) for _ in range(size)])
        seen = worker.result(timeout=WORKER_CAP_S + 30)
    cpu_us = (seen["cpu_s"] or math.nan) * 1e6 / max(1, len(seen["ids"]))
    burst = {
        "tasks": n,
        "drain_s": round(seen["last"] - due, 2) if seen["last"] else None,
        "per_s": round(n / (seen["last"] - due)) if seen["last"] else 0,
        "worker_cpu_us_per_task": round(cpu_us, 1),
        **verdict(ids, seen["ids"]),
    }
    return {"setup": "plain queue (no shards) on one standalone Redis", "steady": steady,
            "burst": burst}  # fmt: skip


# -- 6. the projection ---------------------------------------------------------------------------


def _worst_cost(section: dict[str, Any] | None) -> float | None:
    if not section:
        return None
    costs = [row["cpu_us_per_task"] for row in section["cpu"].values() if row["cpu_us_per_task"]]
    return max(costs) if costs else None


def projection(results: dict[str, Any]) -> dict[str, Any]:
    """What a 10-master cluster could carry, from the measured Redis CPU per task, for the
    bulk regime (the burst) and the one-by-one regime (the spread's mixed load)."""
    bulk = _worst_cost(results.get("burst"))
    single = _worst_cost(results.get("spread", {}).get("orders"))
    if bulk is None and single is None:
        return {}
    headroom = 0.7  # plan a Redis main thread at 70% busy, not 100%
    out: dict[str, Any] = {"planned_busy": headroom}
    for regime, cost in (("bulk", bulk), ("one_by_one", single)):
        if cost is not None:
            per_master = ONE_CORE_US / cost
            out[regime] = {
                "cpu_us_per_task_worst_master": cost,
                "one_master_ceiling_per_s": round(per_master),
                "ten_masters_at_70pct_per_s": round(10 * per_master * headroom),
                # 16 shards on 10 masters: 6 hold 2 shards, 4 hold 1; the busiest carries 2/16.
                "ten_masters_16_shards_at_70pct_per_s": round(per_master * headroom * SHARDS / 2),
            }
    worker = results.get("burst", {}).get("per_s_with_a_free_core")
    lines = [
        "Redis runs a script on one thread, so a master saturates at 1 s of CPU per second; "
        "shards share no key, so masters add up, as long as the shards spread evenly over "
        "them (shards a multiple of the masters, e.g. shards=40 on 10 masters: 4 each; with "
        "shards=16 on 10 masters 6 masters hold 2 shards and 4 hold 1, so the busiest "
        "carries 2/16 of the load and the cluster saturates at 8x one master, not 10x)."
    ]
    regimes = (
        ("bulk", "In bulk (offer_many, fetches and acks of many tasks)"),
        (
            "one_by_one",
            "One by one (the spread's mixed load: single offers, tasks due a few at a time, "
            "so each fetch and ack carries few)",
        ),
    )
    for regime, label in regimes:
        if regime in out:
            r = out[regime]
            lines.append(
                f"{label} a task costs its master {r['cpu_us_per_task_worst_master']:.1f} us: "
                f"{r['one_master_ceiling_per_s']:,} tasks/s per master, "
                f"{r['ten_masters_at_70pct_per_s']:,} tasks/s on 10 masters at 70% busy "
                f"({r['ten_masters_16_shards_at_70pct_per_s']:,} with shards=16)."
            )
    if worker and "bulk" in out:
        need = math.ceil(out["bulk"]["ten_masters_at_70pct_per_s"] / worker)
        lines.append(
            f"The consumers must scale too: one AsyncWorker process spends "
            f"{ONE_CORE_US / worker:.1f} us of its own CPU per task ({worker:,} tasks/s with "
            f"a core to itself), so the bulk figure needs about {need} worker processes, on "
            "machines of their own."
        )
    lines.append(
        "Not measured: this machine has 2 cores, so the 3 local masters, the worker and the "
        "producer share them; CPU costs depend on that far less than rates do."
    )
    out["reasoning"] = " ".join(lines)
    return out


def summary(results: dict[str, Any]) -> list[str]:
    """The bars and what was measured, one line each (docs/ha.md shows these lines)."""
    lines = []

    def row(what: str, measured: str, met: bool | None) -> None:
        verdict = "" if met is None else ("met" if met else "MISSED")
        lines.append(f"{what:<46} {measured:<50} {verdict}".rstrip())

    if "spread" in results:
        for name in ("orders", "promo"):
            r = results["spread"][name]
            split = "/".join(str(n) for n in sorted(r["shards_per_master"].values()))
            row(
                f"spread {name!r} ({split} shards), 25-42%",
                f"{r['min_share_pct']}% .. {r['max_share_pct']}% of calls per master",
                r["bar_met"],
            )
        layouts = results["spread"]["layouts"]
        row(
            "  names whose 16 shards fall 4/6/6",
            f"{layouts['names_with_a_master_at_25pct_or_less']} of {layouts['names']}",
            None,
        )
    if "steady" in results:
        r = results["steady"]
        row(
            "steady lateness p99 <= 10 ms",
            f"p50 {r['p50_ms']:g}, p99 {r['p99_ms']:g}, max {r['max_ms']:g} ms, early {r['early']}",
            r["bar_met"],
        )
    if "burst" in results:
        r = results["burst"]
        row(
            f"burst {r['tasks']:,}: >= 20,000/s, 0 lost/dup",
            f"{r['per_s']:,}/s, lost {r['lost']}, duplicated {r['duplicated']}",
            r["bar_met"],
        )
        row(
            "  worker CPU per task (rate with a free core)",
            f"{r['worker_cpu_us_per_task']} us ({r['per_s_with_a_free_core']:,}/s)",
            None,
        )
        for master, c in r["cpu"].items():
            row(
                f"  Redis CPU per task, {master}",
                f"{c['cpu_us_per_task']} us ({c['tasks']:,} tasks)",
                None,
            )
    if "spread" in results:
        for master, c in results["spread"]["orders"]["cpu"].items():
            row(
                f"  one-by-one load, {master}",
                f"{c['cpu_us_per_task']} us ({c['tasks']:,} tasks)",
                None,
            )
    if "durable" in results:
        r = results["durable"]
        for kind, label in (("one_by_one", "one by one"), ("bulk", "offer_many")):
            row(
                f"durable offers/s, {label}",
                f"{r['durable'][kind + '_per_s']:,} vs {r['plain'][kind + '_per_s']:,} "
                f"without ({r[kind + '_ratio']}x)",
                None,
            )
    if "control" in results:
        r = results["control"]
        row(
            "control: plain queue, one Redis, steady",
            f"p50 {r['steady']['p50_ms']:g}, p99 {r['steady']['p99_ms']:g}, "
            f"max {r['steady']['max_ms']:g} ms",
            None,
        )
        row("control: plain queue, one Redis, burst", f"{r['burst']['per_s']:,}/s", None)
    for regime in ("bulk", "one_by_one"):
        r = results.get("projection_10_masters", {}).get(regime)
        if r:
            row(
                f"projection, 10 masters at 70%, {regime.replace('_', ' ')}",
                f"{r['ten_masters_at_70pct_per_s']:,} tasks/s "
                f"(shards=16: {r['ten_masters_16_shards_at_70pct_per_s']:,})",
                None,
            )
    return lines


# -- main ----------------------------------------------------------------------------------------


SCENARIOS = ("durable", "spread", "burst", "steady", "control")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a 50,000-task burst)")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--redis-server", help="the redis-server binary (default: PATH's)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="the burst worker's concurrency (64 as bench/worker.py's drain; 8 is the default)",
    )
    args = parser.parse_args(argv)
    wanted = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    sizes = QUICK if args.quick else FULL
    binary = find_redis_server(args.redis_server)
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "redis": EmbeddedRedis(binary).version,
        },
        "sizes": asdict(sizes),
        "shards": SHARDS,
        "masters": 3,
    }
    print(f"machine: {results['machine']}, sizes: {results['sizes']}", flush=True)
    started = time.perf_counter()

    def show(name: str, step: Callable[[], dict[str, Any]]) -> None:
        t0 = time.perf_counter()
        load = os.getloadavg()[0]
        results[name] = step()
        # Other work on the machine takes cores from the servers and the worker: say how much.
        results[name]["load_avg_1min"] = [round(load, 1), round(os.getloadavg()[0], 1)]
        shown = {k: v for k, v in results[name].items() if k not in ("acked_per_shard",)}
        print(f"{name} ({time.perf_counter() - t0:.1f} s): {json.dumps(shown, indent=2)}")

    if "durable" in wanted:
        show("durable", lambda: bench_durable(binary, sizes))
    cluster_steps = [name for name in ("spread", "burst", "steady") if name in wanted]
    if cluster_steps:
        with EmbeddedCluster(3, binary) as cluster:
            url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
            steps: dict[str, Callable[[], dict[str, Any]]] = {
                "spread": lambda: bench_spreads(url, cluster, sizes),
                "burst": lambda: bench_burst(url, cluster, sizes, args.concurrency),
                "steady": lambda: bench_steady(url, sizes),
            }
            for name in cluster_steps:
                reset(cluster)
                show(name, steps[name])
    if "control" in wanted:
        show("control", lambda: bench_control(binary, sizes, args.concurrency))
    if "spread" in results or "burst" in results:
        results["projection_10_masters"] = projection(results)
        print(f"projection: {json.dumps(results['projection_10_masters'], indent=2)}")
    results["seconds"] = round(time.perf_counter() - started, 1)
    results["summary"] = summary(results)
    print("\n".join(results["summary"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out} ({results['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

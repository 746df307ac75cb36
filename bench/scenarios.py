"""The scenarios of the peer benchmark (issue #5). Each function runs ONE run of one contestant
against a flushed Redis and returns a dict of figures (``bench/__main__.py`` repeats, takes
medians and writes the report)."""

from __future__ import annotations

import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

from .harness import (
    BenchError,
    Counters,
    SinkReader,
    cpu_delta,
    lateness_summary,
    process_tree_cpu,
    sample,
    start_worker,
    verdict,
)
from .peers.base import Contestant, Job

QUEUE = "bench"


@dataclass(frozen=True)
class Sizes:
    """Sizes, caps and repeats of one benchmark mode."""

    repeat_fast: int = 3  # enqueue (and memory, measured with it)
    repeat_slow: int = 1  # lateness, burst, idle, crash
    enqueue_n: int = 20_000
    enqueue_delay: float = 600.0
    enqueue_cap: float = 4.0  # seconds of one-by-one enqueueing per run, at most
    steady_n: int = 2_000
    sparse_n: int = 40
    spread: float = 10.0
    lead: float = 2.0
    tail: float = 8.0  # wait at most this long past the last due time
    burst_n: int = 50_000
    burst_cap: float = 20.0  # seconds after the due instant
    big_n: int = 1_000_000  # delayq-async only
    big_cap: float = 120.0
    idle_n: int = 100_000
    idle_topup_cap: float = 10.0  # seconds of enqueueing the idle tasks, at most
    idle_settle: float = 12.0  # at least, then until the command rate is steady ...
    idle_settle_cap: float = 20.0  # ... or this long
    idle_window: float = 10.0
    crash_n: int = 100
    # delayq's visibility timeout + 5 s. The full run sets it to 10 s (not the default 30 s)
    # to fit 10 contestants in ~15 minutes; the bar (vt + 1 s) scales with it, and no peer
    # redelivers within 35 s either (bench/README.md).
    crash_cap: float = 15.0
    crash_hold_wait: float = 10.0  # wait at most this long for the held set to settle
    delayq_visibility: str | None = "10s"
    redis_benchmark_n: int = 100_000


FULL = Sizes()
QUICK = replace(
    FULL,
    repeat_fast=1,
    enqueue_n=5_000,
    enqueue_cap=3.0,
    steady_n=500,
    sparse_n=20,
    spread=5.0,
    tail=5.0,
    burst_n=10_000,
    burst_cap=20.0,
    big_n=100_000,
    big_cap=30.0,
    idle_n=10_000,
    idle_topup_cap=5.0,
    idle_settle=3.0,
    idle_settle_cap=8.0,
    idle_window=5.0,
)
SMOKE = replace(
    FULL,
    repeat_fast=1,
    enqueue_n=200,
    enqueue_delay=600.0,
    enqueue_cap=2.0,
    steady_n=60,
    sparse_n=5,
    spread=1.0,
    lead=1.0,
    tail=2.5,
    burst_n=300,
    burst_cap=4.0,
    big_n=3_000,
    big_cap=10.0,
    idle_n=300,
    idle_topup_cap=2.0,
    idle_settle=0.5,
    idle_settle_cap=0.5,
    idle_window=1.0,
    crash_n=10,
    crash_cap=8.0,  # a fresh process starts on a loaded CI machine too
    crash_hold_wait=1.5,
    delayq_visibility="1s",
    redis_benchmark_n=2_000,
)


@dataclass
class Env:
    """What every run needs: the server, a scratch directory, the sizes."""

    url: str
    tmp: Path
    sizes: Sizes
    rates: dict[str, float]  # contestant name (+":bulk") -> measured enqueue rate

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            client.flushall()
        finally:
            client.close()

    def sink(self, label: str) -> Path:
        path = self.tmp / f"{label}-{time.time_ns()}.sink"
        path.touch()
        return path

    def used_memory(self) -> int:
        client = redis.Redis.from_url(self.url)
        try:
            return int(client.info("memory")["used_memory"])
        finally:
            client.close()


def enqueue_all(
    c: Contestant, env: Env, jobs: list[Job], *, prefer_bulk: bool = True, preload: bool = False
) -> float:
    """Enqueue every job, with the bulk API when the peer has one; returns seconds spent.
    ``preload``: tasks a scenario only needs in place (:meth:`Contestant.preload`)."""
    enqueue = c.preload if preload else c.enqueue
    if prefer_bulk:
        try:
            return enqueue(env.url, QUEUE, jobs, bulk=True)
        except NotImplementedError:
            pass
    return enqueue(env.url, QUEUE, jobs, bulk=False)


def enqueue_rate(c: Contestant, env: Env, *, preload: bool = False) -> float:
    """Tasks/s at which the harness can feed this peer (measured or probed)."""
    names = [c.name]
    helper = c.preloader() if preload else None
    if helper:
        names.insert(0, helper.name)
    for key in [f"{name}{kind}" for name in names for kind in (":bulk", "")]:
        if key in env.rates:
            return env.rates[key]
    far = time.time() + 3600
    probe = [Job(100_000_000 + k, far) for k in range(200)]
    spent = enqueue_all(c, env, probe)
    env.flush()
    return 200 / max(spent, 1e-6)


# -- 1. enqueue (and 5. memory) --------------------------------------------------------------


def run_enqueue(c: Contestant, env: Env, bulk: bool) -> dict[str, Any]:
    s = env.sizes
    env.flush()
    due = time.time() + s.enqueue_delay
    jobs = [Job(i, due) for i in range(s.enqueue_n)]
    before = env.used_memory()
    spent, done = 0.0, 0
    chunk = s.enqueue_n if bulk else 2_000
    while done < len(jobs):
        part = jobs[done : done + chunk]
        spent += c.enqueue(env.url, QUEUE, part, bulk=bulk)  # NotImplementedError: no bulk API
        done += len(part)
        if not bulk and spent > s.enqueue_cap:
            break
    after = env.used_memory()
    rate = done / max(spent, 1e-9)
    env.rates[f"{c.name}:bulk" if bulk else c.name] = rate
    return {
        "tasks": done,
        "per_s": round(rate),
        "seconds": round(spent, 3),
        "bytes_per_task": round((after - before) / done) if done else None,
    }


# -- 2./3. lateness --------------------------------------------------------------------------


def run_lateness(c: Contestant, env: Env, n: int) -> dict[str, Any]:
    s = env.sizes
    env.flush()
    sink = env.sink(f"{c.name}-lateness")
    with start_worker(c, env.url, QUEUE, sink, env.tmp) as worker:
        t0 = time.time()
        rng = random.Random(n)
        jobs = sorted(
            (Job(i, t0 + s.lead + rng.random() * s.spread) for i in range(n)), key=lambda j: j.due
        )
        # One by one: each delay is computed just before its own call. A bulk call computes
        # the delays of a whole chunk first and lands them milliseconds later, which would
        # count against bulk-capable contestants as lateness.
        enqueue_all(c, env, jobs, prefer_bulk=False)
        enqueued_by = time.time()
        reader = SinkReader(sink)
        deadline = t0 + s.lead + s.spread + s.tail
        while time.time() < deadline:
            if reader.count_lines() >= n + 1 and len(reader.seen() - {-1}) >= n:
                break
            if not worker.alive():
                raise BenchError(f"worker died: {worker.log_tail()}")
            time.sleep(0.1)
    v = verdict(reader.read(), n)
    out: dict[str, Any] = {"tasks": n, **lateness_summary(v["lateness_ms"])}
    out.update(delivered=v["delivered"], lost=v["lost"], duplicated=v["duplicated"])
    out.update(early=v["early"], lateness_sample=sample(v["lateness_ms"], 200))
    if enqueued_by > t0 + s.lead:
        out["note"] = f"enqueueing ended {enqueued_by - t0 - s.lead:.2f} s after the first due time"
    return out


# -- 4. burst --------------------------------------------------------------------------------


def run_burst(c: Contestant, env: Env, n: int, cap: float) -> dict[str, Any]:
    env.flush()
    sink = env.sink(f"{c.name}-burst")
    rate = enqueue_rate(c, env, preload=True)
    with start_worker(c, env.url, QUEUE, sink, env.tmp) as worker:
        due = time.time() + max(2.0, 1.5 * n / rate + 1.5)
        enqueue_all(c, env, [Job(i, due) for i in range(n)], preload=True)
        enqueued_by = time.time()
        counters = Counters(env.url)
        time.sleep(max(0.0, due - time.time()))
        before = counters.snapshot()
        cpu_before = process_tree_cpu(worker.pid)
        reader = SinkReader(sink)
        while time.time() < due + cap:
            if reader.count_lines() >= n + 1 and len(reader.seen() - {-1}) >= n:
                break
            if not worker.alive():
                raise BenchError(f"worker died: {worker.log_tail()}")
            time.sleep(0.1)
        after = counters.snapshot()
        worker_cpu = cpu_delta(cpu_before, process_tree_cpu(worker.pid))
        counters.close()
    rows = [r for r in reader.read() if r[0] >= 0]
    v = verdict(rows, n)
    last = v["last_start"]
    complete = v["lost"] == 0
    elapsed = (last - due) if complete and last else cap
    redis_used = Counters.delta(before, after)
    delivered = v["delivered"]

    def per_task(total: float) -> float | None:  # nothing ran: no cost per task to speak of
        return round(total / delivered, 2) if delivered else None

    starts = sorted(r[2] - due for r in rows)
    out = {
        "tasks": n,
        "delivered": v["delivered"],
        "seconds": round(elapsed, 3),
        "per_s": round(v["delivered"] / max(elapsed, 1e-9)),
        "complete": complete,
        "lost": v["lost"] if complete else None,  # an incomplete drain: not lost, not yet run
        "pending_at_cap": 0 if complete else v["lost"],
        "duplicated": v["duplicated"],
        "redis_commands_per_task": per_task(redis_used["commands"]),
        "redis_cpu_us_per_task": per_task(redis_used["cpu_s"] * 1e6),
        "worker_cpu_us_per_task": per_task(worker_cpu * 1e6),
        "drain_curve": _curve(starts, n),
    }
    if enqueued_by > due:
        out["note"] = f"enqueueing ended {enqueued_by - due:.2f} s after the due instant"
    return out


def _curve(starts: list[float], n: int, points: int = 120) -> list[list[float]]:
    """[seconds since due, delivered so far] at up to ``points`` places."""
    if not starts:
        return []
    step = max(1, len(starts) // points)
    curve = [[round(starts[k], 4), k + 1] for k in range(0, len(starts), step)]
    if curve[-1][1] != len(starts):
        curve.append([round(starts[-1], 4), len(starts)])
    return curve


# -- 6. idle ---------------------------------------------------------------------------------


def run_idle(
    c: Contestant, env: Env, setup: AbstractContextManager[Any] | None = None
) -> dict[str, Any]:
    """``setup``: held while enqueueing (side by side, one contestant enqueues at a time, so
    that every one of them gets its tasks in at its own speed).

    The worker starts (and handles its warm-up job) first, then the tasks arrive: with 100,000
    delayed messages already queued, dramatiq's worker did not reach the warm-up job in 60 s.
    """
    s = env.sizes
    env.flush()
    far = time.time() + 3600
    scheduled, spent = 0, 0.0
    chunk = s.idle_n
    bulk = True
    sink = env.sink(f"{c.name}-idle")
    counters = Counters(env.url)
    with start_worker(c, env.url, QUEUE, sink, env.tmp) as worker:
        with setup or nullcontext():
            while scheduled < s.idle_n and spent < s.idle_topup_cap:
                part = [Job(i, far) for i in range(scheduled, min(s.idle_n, scheduled + chunk))]
                try:
                    spent += c.preload(env.url, QUEUE, part, bulk=bulk)
                except NotImplementedError:
                    bulk, chunk = False, 2_000
                    continue
                scheduled += len(part)
        # settle: at least idle_settle, then until two 1-s command rates agree (or the cap)
        started = time.time()
        time.sleep(s.idle_settle)
        previous: float | None = None
        while time.time() - started < s.idle_settle_cap:
            a = counters.snapshot()
            time.sleep(1.0)
            rate = Counters.delta(a, counters.snapshot())["commands"]
            if previous is not None and abs(rate - previous) <= 0.2 * previous + 2:
                break
            previous = rate
        settled = time.time() - started
        before = counters.snapshot()
        cpu_before = process_tree_cpu(worker.pid)
        monitor = _Monitor(env.url, ignore=counters.address())
        time.sleep(s.idle_window)
        requests = monitor.stop()
        after = counters.snapshot()
        cpu_s = cpu_delta(cpu_before, process_tree_cpu(worker.pid))
        if not worker.alive():
            raise BenchError(f"worker died: {worker.log_tail()}")
    counters.close()
    d = Counters.delta(before, after)
    if requests is not None:
        d["commands"] -= 1  # redis-cli's MONITOR command
    return {
        "scheduled": scheduled,
        "settle_s": round(settled, 1),
        "window_s": round(d["seconds"], 1),
        "commands_per_s": round(d["commands"] / d["seconds"], 2),
        "requests_per_s": None if requests is None else round(requests / s.idle_window, 2),
        "worker_cpu_pct": round(100 * cpu_s / d["seconds"], 2),
        "redis_cpu_pct": round(100 * d["cpu_s"] / d["seconds"], 2),
    }


class _Monitor:
    """``redis-cli monitor`` for a while: counts the requests clients sent (MONITOR shows the
    commands scripts run as coming from "lua"; those, and the harness's own, are left out)."""

    def __init__(self, url: str, ignore: str) -> None:
        self.ignore = ignore
        cli = shutil.which("redis-cli")
        port = url.rsplit(":", 1)[1].split("/")[0]
        # A file, not a pipe: nobody reads during the window, and a full pipe (64 KiB) stalled
        # redis-cli, so chatty workers' requests went uncounted (416 of 3,000 SETs).
        self.out = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in stop()
        self.proc = (
            subprocess.Popen(
                [cli, "-h", "127.0.0.1", "-p", port, "monitor"],
                stdout=self.out,
                stderr=subprocess.DEVNULL,
            )
            if cli
            else None
        )

    def stop(self) -> int | None:
        if self.proc is None:
            self.out.close()
            return None
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.out.seek(0)
        out = self.out.read()
        self.out.close()
        count = 0
        for line in out.splitlines():
            if not line[:1].isdigit() or "[" not in line:
                continue  # "OK" and partial lines
            source = line.split("[", 1)[1].split("]", 1)[0]
            if " lua" in source or source.endswith(self.ignore):
                continue
            count += 1
        return count


# -- 7. crash --------------------------------------------------------------------------------


def run_crash(
    c: Contestant, env: Env, setup: AbstractContextManager[Any] | None = None
) -> dict[str, Any]:
    """``setup``: held until the holding worker is killed (side by side, one contestant at a
    time gets its tasks held; the redelivery waits run at once)."""
    s = env.sizes
    env.flush()
    n = s.crash_n
    first = env.sink(f"{c.name}-crash-held")
    with setup or nullcontext():
        now = time.time()
        enqueue_all(c, env, [Job(i, now) for i in range(n)])
        with start_worker(c, env.url, QUEUE, first, env.tmp, hold=True, warm=False) as holder:
            reader = SinkReader(first)
            # wait for the first start, then until no new start for 1 s (or all n, or the cap)
            deadline = time.monotonic() + 60
            while not reader.count_lines() and time.monotonic() < deadline:
                if not holder.alive():
                    raise BenchError(f"holding worker died: {holder.log_tail()}")
                time.sleep(0.05)
            settle_by = time.monotonic() + s.crash_hold_wait
            last_count, last_change = reader.count_lines(), time.monotonic()
            while time.monotonic() < settle_by and last_count < n:
                time.sleep(0.05)
                count = reader.count_lines()
                if count != last_count:
                    last_count, last_change = count, time.monotonic()
                elif time.monotonic() - last_change > 1.0:
                    break
            killed = time.time()
    held = reader.seen()
    second = env.sink(f"{c.name}-crash-fresh")
    with start_worker(c, env.url, QUEUE, second, env.tmp, warm=False) as fresh:
        again = SinkReader(second)
        while time.time() < killed + s.crash_cap:
            if again.count_lines() >= n and {i for i in range(n)} <= again.seen():
                break
            if not fresh.alive():
                raise BenchError(f"fresh worker died: {fresh.log_tail()}")
            time.sleep(0.05)
    rows = again.read()
    seen_again = {r[0] for r in rows}
    redelivered = held & seen_again
    complete = set(range(n)) <= seen_again
    held_times = [r[2] for r in rows if r[0] in held]
    return {
        "tasks": n,
        "held": len(held),
        "redelivered": len(redelivered),
        "all_delivered_s": round(max(r[2] for r in rows) - killed, 2) if complete else None,
        "held_redelivered_s": (
            round(max(held_times) - killed, 2) if held and redelivered == held else None
        ),
        "lost": n - len(seen_again & set(range(n))),
        "cap_s": s.crash_cap,
    }


# -- redis-benchmark -------------------------------------------------------------------------


def run_redis_benchmark(url: str, n: int) -> dict[str, Any]:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {"unavailable": "no redis-benchmark on PATH"}
    port = url.rsplit(":", 1)[1].split("/")[0]
    out: dict[str, Any] = {"n": n}
    for label, extra in (("plain", []), ("pipeline_16", ["-P", "16"])):
        proc = subprocess.run(
            [binary, "-h", "127.0.0.1", "-p", port, "-q", "-t", "zadd,lpush", "-n", str(n), *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for line in proc.stdout.replace("\r", "\n").splitlines():
            if "requests per second" in line and ":" in line:
                name, rest = line.split(":", 1)
                value = rest.strip().split()[0]
                out[f"{name.strip().lower()}_{label}"] = round(float(value))
    return out


# -- medians ---------------------------------------------------------------------------------


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Field-by-field median of repeated runs; lost/duplicated/early: the maximum; lists and
    text: from the median run (by per_s or p99)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1].get("error", "no run")}
    key: Callable[[dict[str, Any]], float] = lambda r: float(  # noqa: E731
        r.get("per_s") or r.get("p99_ms") or r.get("commands_per_s") or 0
    )
    middle = sorted(ok, key=key)[len(ok) // 2]
    merged: dict[str, Any] = {}
    for name, value in middle.items():
        values = [r.get(name) for r in ok]
        if name in ("lost", "duplicated", "early"):
            known = [v for v in values if v is not None]
            merged[name] = max(known) if known else None
        elif isinstance(value, bool) or not isinstance(value, int | float):
            merged[name] = value
        else:
            nums = [v for v in values if isinstance(v, int | float)]
            merged[name] = round(statistics.median(nums), 3) if nums else None
    merged["runs"] = len(ok)
    if len(ok) < len(runs):
        merged["failed_runs"] = len(runs) - len(ok)
    return merged

"""The peer benchmark of issue #5: ``python -m bench`` (see bench/README.md).

Runs delayq and its peers one at a time against one private redis-server, writes
``bench/results/peers.json`` and regenerates ``docs/benchmarks.md`` and the plots.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis

from delayq.embedded import EmbeddedRedis

from . import report, scenarios
from .peers import discover
from .peers.base import ROOT, Contestant
from .scenarios import FULL, QUICK, SMOKE, Env, Sizes

SCENARIOS = ["enqueue", "steady", "sparse", "burst", "big", "memory", "idle", "crash"]
RESULTS = ROOT / "bench" / "results"


def estimate(sizes: Sizes, names: list[str], chosen: list[str]) -> float:
    """Rough wall time in seconds (assumes ~3,000 tasks/s one by one, 1.5 s worker starts)."""
    start = 1.5
    per: dict[str, float] = {
        "enqueue": sizes.repeat_fast
        * (min(sizes.enqueue_n / 3000, sizes.enqueue_cap) + sizes.enqueue_n / 30000 + 0.5),
        "steady": sizes.repeat_slow * (start + sizes.lead + sizes.spread + 1.5),
        "sparse": sizes.repeat_slow * (start + sizes.lead + sizes.spread + 1.5),
        "burst": sizes.repeat_slow * (start + sizes.burst_n / 5000 + 0.5 * sizes.burst_cap),
    }
    total = sum(per.get(s, 0.0) for s in chosen) * len(names)
    # side by side: the busy parts one contestant after another, the waits at once
    if "idle" in chosen:
        idle_alone = start + sizes.idle_settle + 2 + sizes.idle_window
        total += sizes.repeat_slow * (len(names) * sizes.idle_topup_cap / 2 + idle_alone)
    if "crash" in chosen:
        holding = 2 * start + 1.5
        total += sizes.repeat_slow * (len(names) * holding + start + sizes.crash_cap)
    if "big" in chosen and "delayq-async" in names:
        total += sizes.big_n / 40_000 + sizes.big_n / 20_000 + start
    if "redis-benchmark" not in os.environ.get("BENCH_SKIP", ""):
        total += 2 * sizes.redis_benchmark_n / 40_000
    return total


def machine(url: str) -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    client = redis.Redis.from_url(url)
    try:
        server = client.info("server")
    finally:
        client.close()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "redis": server["redis_version"],
        "platform": platform.platform(),
        "node": _node_version(),
    }


def _node_version() -> str | None:
    import shutil
    import subprocess

    node = shutil.which("node")
    if not node:
        return None
    try:
        return subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


def run_one(label: str, fn: Any, repeat: int, log: Any) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for r in range(repeat):
        started = time.monotonic()
        try:
            result = fn()
        except NotImplementedError as exc:
            return {"unsupported": str(exc) or "not supported"}
        except Exception as exc:  # one run failing must not stop the benchmark
            result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            if os.environ.get("BENCH_DEBUG"):
                traceback.print_exc()
        result["wall_s"] = round(time.monotonic() - started, 1)
        runs.append(result)
        brief = {k: v for k, v in result.items() if not isinstance(v, list)}
        print(f"  {label} run {r + 1}/{repeat}: {brief}", file=log, flush=True)
    return {"median": scenarios.median_of(runs), "runs": runs}


def side_by_side(
    scenario: str, contestants: list[Contestant], tmp: Path, sizes: Sizes, log: Any
) -> dict[str, dict[str, Any]]:
    """A scenario whose figures are set by timers, run for every contestant at once, each on
    a Redis server of its own: the idle worker's command rate (its poll timers) and the crash
    redelivery (visibility timeouts). One after another they spent ~9 of the benchmark's
    minutes waiting. Their busy parts (enqueueing; getting tasks held and killing the
    holder) run one contestant at a time, under the ``setup`` lock."""
    run = {"idle": scenarios.run_idle, "crash": scenarios.run_crash}[scenario]
    servers = {c.name: EmbeddedRedis().start() for c in contestants}
    setup = threading.Lock()
    try:
        with ThreadPoolExecutor(max_workers=len(contestants)) as pool:
            futures = {
                c.name: pool.submit(
                    run_one,
                    f"{c.name} {scenario}",
                    lambda c=c: run(c, Env(servers[c.name].url, tmp, sizes, {}), setup),
                    sizes.repeat_slow,
                    log,
                )
                for c in contestants
            }
            return {name: future.result() for name, future in futures.items()}
    finally:
        for server in servers.values():
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smaller sizes (a few minutes)")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument("--only", help="contestants, comma-separated (default: all)")
    parser.add_argument(
        "--scenarios", help=f"comma-separated, from {','.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--repeat", type=int, help="runs of the fast scenarios (enqueue)")
    parser.add_argument("--repeat-slow", type=int, help="runs of the other scenarios")
    parser.add_argument("--out", type=Path, help="results directory (default bench/results)")
    parser.add_argument(
        "--docs", type=Path, help="docs directory to write benchmarks.md and img/ into"
    )
    parser.add_argument("--no-docs", action="store_true", help="write the JSON only")
    parser.add_argument("--estimate", action="store_true", help="print the time estimate and exit")
    args = parser.parse_args(argv)

    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.repeat:
        sizes = scenarios.replace(sizes, repeat_fast=args.repeat)
    if args.repeat_slow:
        sizes = scenarios.replace(sizes, repeat_slow=args.repeat_slow)
    chosen = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    contestants = discover()
    if args.only:
        wanted = args.only.split(",")
        missing = set(wanted) - {c.name for c in contestants}
        if missing:
            parser.error(f"unknown contestants: {sorted(missing)}")
        contestants = [c for c in contestants if c.name in wanted]
    available: list[Contestant] = []
    skipped: dict[str, str] = {}
    for c in contestants:
        reason = c.unavailable()
        if reason:
            skipped[c.name] = reason
        else:
            available.append(c)
    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    est = estimate(sizes, [c.name for c in available], chosen)
    print(
        f"delayq peer benchmark ({mode_name}): {len(available)} contestants, scenarios "
        f"{','.join(chosen)}; estimated wall time {est / 60:.1f} min",
        flush=True,
    )
    for name, reason in skipped.items():
        print(f"  skipped {name}: {reason}", flush=True)
    if args.estimate:
        return 0
    if sizes.delayq_visibility:
        os.environ["BENCH_DELAYQ_VISIBILITY"] = sizes.delayq_visibility

    out_dir = args.out or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="delayq-bench-"))
    server = EmbeddedRedis().start()
    began = time.time()
    results: dict[str, Any] = {
        "mode": mode_name,
        "sizes": vars(sizes) if hasattr(sizes, "__dict__") else {},
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "scenarios": chosen,
        "contestants": {},
        "unavailable": skipped,
    }
    log = sys.stdout
    try:
        env = Env(server.url, tmp, sizes, {})
        results["machine"] = machine(server.url)
        print(f"machine: {results['machine']}", flush=True)
        env.flush()
        results["redis_benchmark"] = scenarios.run_redis_benchmark(
            server.url, sizes.redis_benchmark_n
        )
        print(f"redis-benchmark: {results['redis_benchmark']}", flush=True)
        for c in available:
            entry: dict[str, Any] = {"version": c.version(), "settings": c.settings}
            results["contestants"][c.name] = entry
            print(f"{c.name} {entry['version']}", flush=True)
            t0 = time.monotonic()
            steps = [
                ("enqueue", "enqueue_single", lambda c=c: scenarios.run_enqueue(c, env, False),
                 sizes.repeat_fast),
                ("enqueue", "enqueue_bulk", lambda c=c: scenarios.run_enqueue(c, env, True),
                 sizes.repeat_fast),
                ("steady", "steady", lambda c=c: scenarios.run_lateness(c, env, sizes.steady_n),
                 sizes.repeat_slow),
                ("sparse", "sparse", lambda c=c: scenarios.run_lateness(c, env, sizes.sparse_n),
                 sizes.repeat_slow),
                ("burst", "burst",
                 lambda c=c: scenarios.run_burst(c, env, sizes.burst_n, sizes.burst_cap),
                 sizes.repeat_slow),
            ]  # fmt: skip
            if "memory" in chosen and "enqueue" not in chosen:
                steps.insert(
                    0,
                    ("memory", "enqueue_single",
                     lambda c=c: scenarios.run_enqueue(c, env, False), 1),
                )  # fmt: skip
            for scenario, label, fn, repeat in steps:
                if scenario in chosen:
                    entry[label] = run_one(f"{c.name} {label}", fn, repeat, log)
            if "big" in chosen and c.name == "delayq-async":
                entry["big"] = run_one(
                    f"{c.name} big",
                    lambda c=c: scenarios.run_burst(c, env, sizes.big_n, sizes.big_cap),
                    1,
                    log,
                )
            entry["wall_s"] = round(time.monotonic() - t0, 1)
            env.flush()
            _write(out_dir, results)  # after every contestant: a crash keeps what was measured
        for scenario in ("idle", "crash"):
            if scenario in chosen:
                t0 = time.monotonic()
                for name, runs in side_by_side(scenario, available, tmp, sizes, log).items():
                    results["contestants"][name][scenario] = runs
                results[f"{scenario}_wall_s"] = round(time.monotonic() - t0, 1)
                _write(out_dir, results)
    finally:
        server.stop()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    results["wall_s"] = round(time.time() - began, 1)
    path = _write(out_dir, results)
    print(f"wrote {path} ({results['wall_s'] / 60:.1f} min)", flush=True)
    if not args.no_docs:
        docs = args.docs or (ROOT / "docs")
        written = report.write(results, docs)
        for p in written:
            print(f"wrote {p}", flush=True)
    return 0


def _write(out_dir: Path, results: dict[str, Any]) -> Path:
    path = out_dir / "peers.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(path)
    return path


if __name__ == "__main__":
    raise SystemExit(main())

"""What the otel extra costs when no SDK is configured: ``python -m bench.otel``.

Runs ``bench.core``'s offer (one by one), bulk offer and drain (fetch + ack) scenarios in
child processes, alternating: one with ``opentelemetry-api`` importable and no SDK (the state
of an application that installed ``delayq[otel]`` and never configured tracing), one with it
blocked (``sys.modules["opentelemetry"] = None``: as if the extra were not installed). Prints
the median of ``--rounds`` runs of each; the server is a private redis-server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
if sys.argv[2] == "off":
    sys.modules["opentelemetry"] = None
import redis
from bench.core import bench_drain, bench_offer, bench_offer_many
from delayq._core import tracing
assert tracing.ENABLED is (sys.argv[2] == "on")
url, n = sys.argv[1], int(sys.argv[3])
redis.Redis.from_url(url).flushdb()
offer = bench_offer(url, n, 3)["offer_per_s"]
bulk = bench_offer_many(url, n * 10)["per_s"]
drain = bench_drain(url, n * 10, 500)["per_s"]
print(json.dumps({"offer_per_s": offer, "offer_many_per_s": bulk, "drain_per_s": drain}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of each variant")
    parser.add_argument("--tasks", type=int, default=5000, help="offers per run (x10 bulk)")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, int]]] = {"on": [], "off": []}
    with EmbeddedRedis() as server:
        for _ in range(args.rounds):
            for variant in ("on", "off"):  # alternating: a busy machine hits both alike
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, server.url, variant, str(args.tasks)],
                    cwd=ROOT, capture_output=True, text=True, check=True, timeout=600,
                )  # fmt: skip
                runs[variant].append(json.loads(out.stdout))
    for metric in ("offer_per_s", "offer_many_per_s", "drain_per_s"):
        on = statistics.median(r[metric] for r in runs["on"])
        off = statistics.median(r[metric] for r in runs["off"])
        print(f"{metric:>17}: api, no SDK {on:>9,.0f}/s   without otel {off:>9,.0f}/s   "
              f"ratio {on / off:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Client instructions per task of a plain ``take()``/``ack()`` loop, counted by callgrind:
``python -m bench.client_cost [SRC ...] [--tasks 300,1300]``.

Wall and CPU time swing by 2x on a shared VM from one minute to the next; the number of
instructions a process runs does not (valgrind's callgrind counts them, whatever else the
machine does). For each delayq source tree (``SRC``: a ``src`` directory, default the one
imported) and each flavour (sync ``DelayQueue``, asyncio ``AsyncDelayQueue``), a consumer
takes and acks N1 then N2 tasks due at once, each run under callgrind in a process of its
own; (count at N2 - count at N1) / (N2 - N1) is the loop's cost per task, start-up and
imports cancelled out. Redis is a private ``redis-server`` on a free port. Needs valgrind
(Debian's package); about a minute per tree and flavour.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import delayq
from delayq.embedded import EmbeddedRedis

# The consumer run under callgrind, and the producer that fills its queue first.
CONSUMER = """
import asyncio, sys
from delayq import AsyncDelayQueue, DelayQueue
url, name, n, flavour = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if flavour == "sync":
    q = DelayQueue(name, url)
    for _ in range(n):
        q.take().ack()
    q.close()
else:
    async def main():
        q = AsyncDelayQueue(name, url)
        for _ in range(n):
            await (await q.take()).ack()
        await q.close()
    asyncio.run(main())
"""
PRODUCER = """
import sys
from delayq import DelayQueue, Offer
url, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
payload = {"order_id": 1, "user": "customer-000001@example.com", "sku": "A" * 24}
with DelayQueue(name, url) as q:
    q.offer_many([Offer({**payload, "i": i}, 0) for i in range(n)])
"""


def instructions(src: Path, url: str, flavour: str, n: int) -> int:
    """Instructions callgrind counts in a consumer that takes and acks ``n`` tasks."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    name = f"client-cost-{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-c", PRODUCER, url, name, str(n)], env=env, check=True)
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-c", CONSUMER, url, name, str(n), flavour],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("src", nargs="*", type=Path, help="delayq src directories to compare")
    parser.add_argument("--tasks", default="300,1300", help="N1,N2 (default 300,1300)")
    parser.add_argument("--flavours", default="sync,async")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    n1, n2 = (int(n) for n in args.tasks.split(","))
    trees = args.src or [Path(delayq.__file__).resolve().parents[1]]
    server = EmbeddedRedis().start()
    try:
        for src in trees:
            for flavour in args.flavours.split(","):
                low = instructions(src, server.url, flavour, n1)
                high = instructions(src, server.url, flavour, n2)
                per_task = (high - low) / (n2 - n1)
                print(f"{src} {flavour}: {per_task:,.0f} instructions/task", flush=True)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

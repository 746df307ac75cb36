"""One BullMQ (Python package) worker for the peer benchmark (see :mod:`bench.peers.bullmq_py`).

``python -m bench.peers.bullmq_py_app URL QUEUE SINK 0|1``: a ``bullmq.Worker`` at its defaults
(concurrency 1, lockDuration 30 s, stalledInterval 30 s, drainDelay 5 s) on QUEUE. Its processor
writes the start line to SINK and returns; with HOLD=1 it then awaits an hour (the event loop
keeps running, so the job's lock is still renewed, as for a real long job).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any

from bullmq import Worker

from bench.peers.base import HOLD_SECONDS, Sink


async def main(url: str, queue: str, sink: str, hold: bool) -> None:
    record = Sink(sink)  # never holds itself: time.sleep would block the event loop

    async def process(job: Any, token: str) -> None:
        record.record_payload(job.data)
        if hold:
            await asyncio.sleep(HOLD_SECONDS)

    worker = Worker(queue, process, {"connection": url})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    try:  # graceful close (waits for the running job), at most 5 s
        await asyncio.wait_for(asyncio.shield(worker.close()), 5.0)
    except TimeoutError:
        with contextlib.suppress(Exception):
            await worker.close(force=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python -m bench.peers.bullmq_py_app URL QUEUE SINK 0|1")
    _url, _queue, _sink, _hold = sys.argv[1:]
    asyncio.run(main(_url, _queue, _sink, _hold == "1"))

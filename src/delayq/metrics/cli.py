"""What ``delayq exporter`` and ``delayq worker --metrics-port`` run (kept out of the CLI
module so that the command line stays thin; importable without prometheus-client)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._base import WorkerRecorder, require_prometheus


def worker_endpoint(
    redis_url: str, queues: Sequence[str], port: int, host: str, prefix: str
) -> tuple[WorkerRecorder, Any]:
    """Start a worker's /metrics (its own metrics and its queues'); raises
    :class:`~delayq.metrics.MetricsUnavailable` without prometheus-client."""
    require_prometheus()
    from ._serve import start_worker_metrics

    recorder, server = start_worker_metrics(redis_url, queues, port=port, host=host, prefix=prefix)
    logging.getLogger("delayq.metrics").info("delayq worker: metrics on %s", server.url)
    return recorder, server


def run_exporter(
    redis_url: str,
    port: int,
    host: str,
    prefix: str,
    queues: Sequence[str] | None,
    overdue_after: float,
    say: Callable[[str], Any],
    outbox: tuple[str, str, str | None] | None = None,
) -> None:
    """Serve the queue metrics (and, with ``outbox`` = (dsn, table, schema), that outbox's
    health) until SIGTERM or SIGINT, then return."""
    require_prometheus()
    from ._serve import start_exporter

    server = start_exporter(
        redis_url,
        port=port,
        host=host,
        prefix=prefix,
        queues=queues or None,
        overdue_after=overdue_after,
        outbox_dsn=outbox[0] if outbox else None,
        outbox_table=outbox[1] if outbox else "delayq_outbox",
        outbox_schema=outbox[2] if outbox else None,
    )
    which = ", ".join(queues) if queues else f"every queue under prefix {prefix!r}"
    if outbox:
        which += f"; outbox {outbox[2] + '.' if outbox[2] else ''}{outbox[1]}"
    say(f"delayq exporter: serving {server.url} ({which})")
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        while not stop.wait(0.5):  # wake now and then: signal handlers run in this thread
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
        say("delayq exporter: stopped")

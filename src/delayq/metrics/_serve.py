"""Serving /metrics: the standalone exporter and a worker's endpoint."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.process_collector import ProcessCollector

from .._core.errors_text import bind_error
from ._collector import QueueCollector
from ._worker import WorkerMetrics

log = logging.getLogger("delayq.metrics")


class MetricsServer:
    """A running /metrics endpoint in a daemon thread: ``registry`` (exposed by
    prometheus-client) followed by the queue collectors (written directly, which is several
    times faster for many queues; see :meth:`QueueCollector.render`)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        collectors: Iterable[QueueCollector] = (),
    ) -> None:
        self.registry = registry
        self.collectors = list(collectors)
        self._server = listen(host, port, _handler(self.body))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="delayq-metrics", daemon=True
        )
        self._thread.start()
        self.host, self.port = host, int(self._server.server_address[1])  # port 0: the pick

    @property
    def url(self) -> str:
        """The address of the metrics page."""
        return f"http://{self.host}:{self.port}/metrics"

    def body(self) -> bytes:
        """One scrape's text."""
        parts = [generate_latest(self.registry)]
        parts += [c.render().encode() for c in self.collectors]
        return b"".join(parts)

    def stop(self) -> None:
        """Stop serving and close the collectors' Redis clients."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        for collector in self.collectors:
            collector.close()


def listen(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """An HTTP server bound to ``host:port``; a refused bind (a busy port, an unknown host)
    is an OSError that names the address, which the bare one does not."""
    try:
        return ThreadingHTTPServer((host, port), handler)
    except OSError as exc:
        raise bind_error(host, port, exc) from exc


def _handler(body: Callable[[], bytes]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server calls it by this name
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            try:
                data = body()
            except Exception:  # a broken collector must not kill the endpoint
                log.exception("delayq metrics: scrape failed")
                self.send_error(500)
                return
            gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
            if gzipped:
                data = gzip.compress(data, compresslevel=1)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            if gzipped:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape is noise

    return Handler


def start_exporter(
    redis: Any = None,
    *,
    port: int = 9808,
    host: str = "127.0.0.1",
    prefix: str = "dq",
    queues: Iterable[str] | None = None,
    overdue_after: float = 1.0,
    registry: CollectorRegistry | None = None,
    outbox_dsn: str | None = None,
    outbox_table: str = "delayq_outbox",
    outbox_schema: str | None = None,
) -> MetricsServer:
    """Serve the queue metrics of ``queues`` (default: every registered queue) on
    ``http://host:port/metrics`` from a daemon thread; returns at once. ``registry``: more
    metrics to serve on the same page (none by default). ``outbox_dsn``: also the health of
    that PostgreSQL outbox table (``delayq_outbox_*``, see ``_outbox.py``; the postgres
    extra)."""
    collector = QueueCollector(redis, prefix=prefix, queues=queues, overdue_after=overdue_after)
    registry = CollectorRegistry() if registry is None else registry
    if outbox_dsn is not None:
        from ._outbox import OutboxHealthCollector

        registry.register(
            OutboxHealthCollector(outbox_dsn, collector.runner, outbox_table, outbox_schema)
        )
    return MetricsServer(registry, host, port, [collector])


def start_worker_metrics(
    redis_url: str,
    queues: Iterable[str],
    *,
    port: int,
    host: str = "127.0.0.1",
    prefix: str = "dq",
) -> tuple[WorkerMetrics, MetricsServer]:
    """A worker's endpoint: its own metrics, the process metrics and the queue metrics of its
    queues, on a fresh registry. Returns the recorder to give the worker and the server."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    recorder = WorkerMetrics(registry)
    collector = QueueCollector(redis_url, prefix=prefix, queues=queues)
    return recorder, MetricsServer(registry, host, port, [collector])

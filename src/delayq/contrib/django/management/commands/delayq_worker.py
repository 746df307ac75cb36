"""``manage.py delayq_worker``: run the handlers of ``DELAYQ["QUEUES"]`` until SIGTERM."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from .....metrics import MetricsUnavailable
from ...conf import delayq_settings
from ...queues import close_queues
from ...worker import build_worker, load_handlers
from .._options import add_metrics_options, metrics_address


class Command(BaseCommand):
    help = (
        "Run delayq handlers on tasks as they fall due, until SIGTERM or Ctrl-C. "
        "Example: manage.py delayq_worker --queue orders --concurrency 8"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", "-q", action="append", default=[], dest="queues",
            help="Queue to consume (repeatable; default: every queue with a HANDLER).",
        )  # fmt: skip
        parser.add_argument("--concurrency", type=int, help="Handlers running at once.")
        parser.add_argument("--health-file", help="File touched while the worker is alive.")
        add_metrics_options(parser, "the worker's and its queues'")

    def handle(self, *args: Any, **options: Any) -> None:
        overrides = {
            name: options[name]
            for name in ("concurrency", "health_file")
            if options.get(name) is not None
        }
        # The command is the program, so it may set logging up (a library never does).
        if not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        server = None
        try:
            address = metrics_address(options)
            if address is not None:
                overrides["metrics"], server = _metrics(options["queues"], *address)
            worker, queues = build_worker(options["queues"], {"handle_signals": True, **overrides})
        except (ImproperlyConfigured, MetricsUnavailable, OSError) as exc:
            if server is not None:
                server.stop()
            raise CommandError(str(exc)) from exc
        try:
            worker.run()  # handles SIGTERM/SIGINT: a graceful stop
        finally:
            for queue in queues:
                queue.close()
            close_queues()  # and the process's connection handle under them
            if server is not None:
                server.stop()


def _metrics(queue_names: list[str], port: int, host: str) -> tuple[Any, Any]:
    """The worker's /metrics on ``host:port``: its recorder and the server."""
    from .....metrics.cli import worker_endpoint  # prometheus-client is optional

    conf = delayq_settings()
    names = list(load_handlers(queue_names))  # the queues it will consume, by their names
    return worker_endpoint(conf.redis_url, names, port, host, conf.prefix)

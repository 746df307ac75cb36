"""``manage.py delayq_worker``: run the handlers of ``DELAYQ["QUEUES"]`` until SIGTERM."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...queues import close_queues
from ...worker import build_worker


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

    def handle(self, *args: Any, **options: Any) -> None:
        overrides = {
            name: options[name]
            for name in ("concurrency", "health_file")
            if options.get(name) is not None
        }
        try:
            worker, queues = build_worker(options["queues"], {"handle_signals": True, **overrides})
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        # The command is the program, so it may set logging up (a library never does).
        if not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        try:
            worker.run()  # handles SIGTERM/SIGINT: a graceful stop
        finally:
            for queue in queues:
                queue.close()
            close_queues()  # and the process's connection handle under them

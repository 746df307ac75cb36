"""``manage.py delayq_relay``: move committed outbox rows into their delayq queues."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.connection import ConnectionDoesNotExist

from ....._core.sizes import parse_size
from .....exceptions import ConfigError
from .....outbox import AsyncRelay, QueueFormat
from ...conf import delayq_settings
from ...database import conninfo
from ...outbox import format_options, get_outbox
from .._options import add_metrics_options, metrics_address

log = logging.getLogger("delayq.outbox")


class Command(BaseCommand):
    help = (
        "Relay the outbox of DELAYQ['DATABASE'] to Redis (DELAYQ['REDIS_URL']) until SIGTERM "
        "or Ctrl-C; woken by LISTEN/NOTIFY at each commit. Any number may run at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", help="Django database alias (default: DELAYQ['DATABASE'])."
        )
        parser.add_argument("--batch-size", type=int, help="Rows claimed per transaction.")
        parser.add_argument(
            "--batch-bytes",
            help="At most this many bytes of tasks per transaction (4MiB, 512KiB or bytes; "
            "default 4MiB); a single larger row goes alone.",
        )
        parser.add_argument(
            "--sweep-interval", type=float, help="Seconds between looks without a NOTIFY."
        )
        add_metrics_options(parser, "the outbox's rows and this relay's counts")
        parser.add_argument(
            "--once",
            action="store_true",
            help="Relay the rows pending now, print how many, and exit (cron, deploys, tests).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            conf = delayq_settings()
            relay_options = {
                name: options[name]
                for name in ("batch_size", "sweep_interval")
                if options.get(name) is not None
            }
            if options.get("batch_bytes") is not None:
                relay_options["batch_bytes"] = parse_size(
                    options["batch_bytes"], "size for --batch-bytes"
                )
            # Each queue's OPTIONS that the relay honours: max_payload_bytes, durability.
            formats = {
                name: QueueFormat(**format_options(queue.options))
                for name, queue in conf.queues.items()
            }
            relay = AsyncRelay(
                conninfo(options.get("database")), conf.redis_url, queues=formats, **relay_options
            )
        except (ImproperlyConfigured, ConfigError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except ConnectionDoesNotExist as exc:
            raise CommandError(
                f"unknown database {options.get('database')!r} (DATABASES has "
                f"{', '.join(sorted(settings.DATABASES)) or 'none'})"
            ) from exc
        # The command is the program, so it may set logging up (a library never does).
        if not logging.getLogger().handlers:
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
        if options.get("once"):
            self.stdout.write(f"relayed {asyncio.run(_once(relay))} rows")
            return
        address = metrics_address(options)
        server = None if address is None else _metrics(relay, options["database"], *address)
        try:
            asyncio.run(_run(relay))
        finally:
            if server is not None:
                server.stop()


def _metrics(relay: AsyncRelay, database: str | None, port: int, host: str) -> Any:
    """The relay's /metrics on ``host:port`` (the outbox's rows and this relay's counts)."""
    from .....metrics import MetricsUnavailable
    from .....outbox._metrics import serve_relay_metrics

    try:
        server = serve_relay_metrics(get_outbox(database), relay.stats, port, host)
    except (MetricsUnavailable, OSError) as exc:
        raise CommandError(str(exc)) from exc
    log.info("delayq relay: metrics on %s", server.url)
    return server


async def _once(relay: AsyncRelay) -> int:
    try:
        return int(await relay.relay_pending())
    finally:
        await relay.close()


async def _run(relay: AsyncRelay) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relay.stop)  # stop after the batch in hand
    log.info("delayq relay started")
    try:
        await relay.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        log.info("delayq relay stopped: %s", relay.stats)

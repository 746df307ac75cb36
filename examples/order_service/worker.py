"""The relay and the close worker as their own process (the API then runs with
``ORDER_SERVICE_BACKGROUND=0``): ``python -m examples.order_service.worker [--role ROLE]``,
where ROLE is ``both`` (the default), ``relay`` or ``worker``. Settings from the environment
(config.py); stops gracefully on SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from delayq.outbox import AsyncOutbox

from .background import ROLES, Background
from .config import Settings
from .db import create_schema, make_engine


async def run(settings: Settings, roles: frozenset[str] = ROLES) -> None:
    engine = make_engine(settings.dsn, pool_size=settings.pool_size)
    try:
        await create_schema(engine)
        await AsyncOutbox(engine, prefix=settings.prefix).install()
        background = Background(settings, engine, roles)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # this process is the program: its signals
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(background.stop()))
        await background.start()
        await background.ready()
        print("order_service worker: ready", flush=True)  # the load script waits for this
        await background.wait()
    finally:
        await engine.dispose()


def main() -> None:
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = argparse.ArgumentParser(prog="python -m examples.order_service.worker")
    parser.add_argument("--role", choices=("both", *sorted(ROLES)), default="both")
    role = parser.parse_args().role
    asyncio.run(run(Settings.from_env(), ROLES if role == "both" else frozenset({role})))


if __name__ == "__main__":
    main()

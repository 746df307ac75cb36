"""Running the dashboard on a real port and driving Debian's chromium (no browser download)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from delayq.dashboard import Settings, create_app
from delayq.embedded import free_port

CHROMIUM = "/usr/bin/chromium"
# The network is closed: without these Chromium keeps trying (and failing) to phone home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_missing_reason() -> str | None:
    """Why the browser tests cannot run, or None. CI (DELAYQ_REQUIRE_ALL_REDIS) must run them."""
    if os.path.exists(CHROMIUM):
        return None
    message = f"{CHROMIUM} not found (apt-get install chromium)"
    if os.environ.get("DELAYQ_REQUIRE_ALL_REDIS"):
        raise RuntimeError(f"CI runs the dashboard's browser tests: {message}")
    return message


@contextmanager
def running(settings: Settings) -> Iterator[str]:
    """The dashboard served by uvicorn on a free port in a thread; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dashboard-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)

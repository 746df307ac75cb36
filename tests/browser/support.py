"""Running the dashboard on a real port and driving Debian's chromium (no browser download)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
def running(settings: Settings, *, sampler: bool = True) -> Iterator[str]:
    """The dashboard served by uvicorn on a free port in a thread; yields its base URL.
    Without ``sampler`` the lifespan (which runs the history sampler) is off."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning",
        lifespan="on" if sampler else "off",
    )  # fmt: skip
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


@contextmanager
def serving_page(html: str) -> Iterator[str]:
    """``html`` served at ``/`` by another server on another port of 127.0.0.1 (another
    origin, yet the same site as the dashboard: cookies ignore ports); yields its URL."""
    body = html.encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    thread = threading.Thread(target=server.serve_forever, name="attacker-page", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)

"""Outbox health an operator can alert on (issue #22): ``delayq exporter --dsn`` and the
dashboard read the table (pending, dead, oldest pending age: samples even when it is empty)
and the relays' heartbeats; a killed relay drops out of ``delayq_outbox_relays_alive``
within two sweep intervals of its last beat."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import pytest

from delayq.dashboard import Settings, create_app
from delayq.embedded import EmbeddedRedis, free_port
from delayq.outbox import Outbox
from tests.helpers import wait_until
from tests.outbox_support import offer_committed, relay_process

pytest.importorskip("prometheus_client")

from delayq.metrics import start_exporter

pytest_plugins = ["tests.outbox_support"]
ROOT = Path(__file__).resolve().parents[2]
SWEEP_S = 0.5  # the relays' sweep interval: a beat vouches for 2 x 0.5 s


def scrape(url: str) -> dict[str, float]:
    """The delayq_outbox_* samples of one scrape, by metric name."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        name: float(value)
        for name, value in re.findall(r'^(delayq_outbox_\w+)\{table="[^"]+"\} (\S+)$', text, re.M)
    }


def test_the_exporter_reads_the_outbox_and_the_relays_heartbeats(
    redis7_server: EmbeddedRedis, pg_dsn: str, table: str, outbox: Outbox, prefix: str
) -> None:
    server = start_exporter(redis7_server.url, port=0, prefix=prefix, outbox_dsn=pg_dsn,
                            outbox_table=table)  # fmt: skip
    try:
        # An empty table and no relay: every gauge has its sample, none is missing.
        assert scrape(server.url) == {
            "delayq_outbox_up": 1.0, "delayq_outbox_pending_rows": 0.0,
            "delayq_outbox_dead_rows": 0.0, "delayq_outbox_oldest_pending_age_seconds": 0.0,
            "delayq_outbox_relays_alive": 0.0,
        }  # fmt: skip
        offer_committed(outbox, pg_dsn, 3)
        time.sleep(0.05)  # (the database's clock: let the oldest row age a little)
        waiting = scrape(server.url)
        assert waiting["delayq_outbox_pending_rows"] == 3.0
        assert waiting["delayq_outbox_oldest_pending_age_seconds"] > 0

        relay_args = ("--sweep-interval", str(SWEEP_S))
        with relay_process(pg_dsn, redis7_server.url, table, *relay_args, name="h1") as relay:
            wait_until(lambda: scrape(server.url)["delayq_outbox_relays_alive"] == 1.0, 10)
            wait_until(lambda: scrape(server.url)["delayq_outbox_pending_rows"] == 0.0, 10)
            relay.send_signal(signal.SIGKILL)
            relay.wait(10)
            killed = time.monotonic()
            wait_until(lambda: scrape(server.url)["delayq_outbox_relays_alive"] == 0.0, 10)
            # Its last beat vouched for 2 sweep intervals at most (+ a scrape's slack).
            assert time.monotonic() - killed < 2 * SWEEP_S + 1.0
    finally:
        server.stop()


def test_the_database_away_is_outbox_up_0_not_missing_samples(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/none?connect_timeout=2"
    server = start_exporter(redis7_server.url, port=0, prefix=prefix, outbox_dsn=dsn)
    try:
        samples = scrape(server.url)
    finally:
        server.stop()
    assert samples == {"delayq_outbox_up": 0.0, "delayq_outbox_relays_alive": 0.0}


def test_exporter_command_checks_the_outbox_at_start(
    redis7_server: EmbeddedRedis, pg_dsn: str
) -> None:
    args = ["exporter", "--port", "0", "--redis", redis7_server.url, "--dsn", pg_dsn,
            "--table", "no_such_outbox"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "delayq.cli", *args], cwd=ROOT, timeout=60,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 1, proc
    assert proc.stderr.strip().splitlines() == [
        "error: no outbox table 'no_such_outbox' in that database: run delayq outbox install"
    ]


async def test_the_dashboard_shows_the_outbox_health(
    redis7_server: EmbeddedRedis, pg_dsn: str, table: str, outbox: Outbox, prefix: str
) -> None:
    offer_committed(outbox, pg_dsn, 2)
    app = create_app(Settings(redis7_server.url, prefix, outbox_dsn=pg_dsn, outbox_table=table))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1") as client:  # fmt: skip
        try:
            page = (await client.get("/")).text
        finally:
            await app.state.dashboard.monitor.close()
    line = page[page.index('id="outbox"') :]
    line = line[: line.index("</p>")]
    assert f"<code>{table}</code>" in line
    assert '<span data-field="outbox_pending">2</span> pending' in line
    assert '<span data-field="outbox_relays">0</span> relay(s) alive' in line
    assert "rows wait and no relay runs" in line

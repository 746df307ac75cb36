"""The CLI, the exporter and the dashboard through a Sentinel URL (and across a failover):
every operator view goes through the same connection layer as the queues."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from delayq import DelayQueue
from delayq.dashboard import Settings, create_app
from delayq.metrics import QueueCollector

from ..conftest import BINARIES
from ..topology import SentinelGroup, running

pytestmark = [pytest.mark.topology]
NAMES = ["orders", "stock", "mail"]


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    with running(SentinelGroup(BINARIES[0][1])) as g:
        yield g


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


async def test_cli_exporter_and_dashboard_on_a_sentinel_url(
    group: SentinelGroup, prefix: str
) -> None:
    for n, name in enumerate(NAMES):
        with DelayQueue(name, group.url, prefix=prefix) as q:
            q.offer_many([(i, 60) for i in range(n + 1)])
    stats = cli("stats", "--json", "--redis", group.url, "--prefix", prefix)
    assert stats.returncode == 0, stats.stderr
    assert {r["queue"]: r["delayed"] for r in json.loads(stats.stdout)} == {
        "orders": 1,
        "stock": 2,
        "mail": 3,
    }
    collector = QueueCollector(group.url, prefix=prefix)
    try:
        assert {s.queue: s.delayed for s in collector.read()}["mail"] == 3
    finally:
        collector.close()
    app = create_app(Settings(redis_url=group.url, prefix=prefix))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    try:
        index = await client.get("/")
        assert index.status_code == 200 and all(f'data-queue="{n}"' in index.text for n in NAMES)
        # After a failover the same views find the new master by themselves.
        group.failover()
        group.wait_settled()
        again = cli("stats", "--json", "--redis", group.url, "--prefix", prefix)
        assert again.returncode == 0, again.stderr
        assert sum(r["delayed"] for r in json.loads(again.stdout)) == 6
        index = await client.get("/")
        assert index.status_code == 200 and 'data-queue="mail"' in index.text
    finally:
        await client.aclose()
        await app.state.dashboard.monitor.close()

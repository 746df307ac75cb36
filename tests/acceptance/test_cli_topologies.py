"""The CLI against a Redis Cluster: every queue is read on its own node, whatever node the
URL names first (today's users saw a raw MOVED error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedCluster

from ..conftest import BINARIES

NAMES = ["orders", "stock", "mail", "receipts", "reminders"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_stats_inspect_and_get_on_a_cluster_url(cluster: EmbeddedCluster, prefix: str) -> None:
    url = "redis+cluster://" + f"127.0.0.1:{cluster.nodes[0].port}"
    ids = {}
    for name in NAMES:
        with DelayQueue(name, url, prefix=prefix) as q:
            ids[name] = q.offer({"queue": name}, delay=60)
    stats = run("stats", "--json", "--redis", url, "--prefix", prefix)
    assert stats.returncode == 0, stats.stderr
    rows = {row["queue"]: row for row in json.loads(stats.stdout)}
    assert sorted(rows) == sorted(NAMES)
    assert all(row["delayed"] == 1 for row in rows.values())
    for name in NAMES:
        got = run("get", name, ids[name], "--json", "--redis", url, "--prefix", prefix)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["payload"] == {"queue": name}
        inspect = run("inspect", name, "--redis", url, "--prefix", prefix)
        assert inspect.returncode == 0 and ids[name] in inspect.stdout, inspect.stderr


def test_plain_url_to_a_cluster_node_is_a_clear_error(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    url = "redis+cluster://" + f"127.0.0.1:{cluster.nodes[0].port}"
    for name in NAMES:
        with DelayQueue(name, url, prefix=prefix) as q:
            q.offer(1, delay=60)
    plain = run(
        "stats", "--redis", f"redis://127.0.0.1:{cluster.nodes[0].port}/0", "--prefix", prefix
    )
    assert plain.returncode != 0
    assert "redis+cluster://" in plain.stderr and "Traceback" not in plain.stderr

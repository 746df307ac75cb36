"""``delayq schedules list|show|pause|resume|remove|trigger|backfill`` (the CLI as a
subprocess, against a real Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]


def cli(server: EmbeddedRedis, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # never the machine's Redis
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", "schedules", *args,
         "--redis", server.url, "--prefix", prefix],
        cwd=ROOT, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def ok(server: EmbeddedRedis, prefix: str, *args: str) -> str:
    done = cli(server, prefix, *args)
    assert done.returncode == 0, done
    return done.stdout


def as_json(server: EmbeddedRedis, prefix: str, *args: str) -> Any:
    return json.loads(ok(server, prefix, *args, "--json"))


def test_schedules_commands(redis7_server: EmbeddedRedis, prefix: str) -> None:
    with DelayQueue("reports", redis7_server.url, prefix=prefix) as q:
        q.schedules.upsert("nightly", {"r": 1}, cron="30 2 * * *", tz="America/New_York")
        q.schedules.upsert("check", "c", every=300)
    listed = as_json(redis7_server, prefix, "list", "reports")
    assert [s["name"] for s in listed] == ["check", "nightly"]
    text = ok(redis7_server, prefix, "show", "reports", "nightly", "--next", "3")
    assert "At 02:30 every day (America/New_York)" in text
    assert text.count(" EST (in ") + text.count(" EDT (in ") == 3, text
    assert "paused" in ok(redis7_server, prefix, "pause", "reports", "check", "--note", "mig")
    shown = as_json(redis7_server, prefix, "show", "reports", "check")
    assert shown["paused"] and shown["note"] == "mig" and shown["next_fires"] == []
    assert "was paused already" in ok(redis7_server, prefix, "pause", "reports", "check")
    assert "resumed" in ok(redis7_server, prefix, "resume", "reports", "check")
    fired = ok(redis7_server, prefix, "trigger", "reports", "nightly", "--request", "r1")
    assert fired.strip() == "s:nightly:m:r1"
    again = ok(redis7_server, prefix, "trigger", "reports", "nightly", "--request", "r1")
    assert again == fired, "the same request is a no-op"
    filled = ok(
        redis7_server, prefix, "backfill", "reports", "nightly",
        "--start", "2026-11-01T00:00-04:00", "--end", "2026-11-03T12:00-05:00",
    )  # fmt: skip
    assert filled.strip() == "3 fire(s) of nightly offered"
    assert "removed" in ok(redis7_server, prefix, "remove", "reports", "check")
    missing = cli(redis7_server, prefix, "remove", "reports", "check")
    assert missing.returncode == 1 and "no schedule 'check'" in missing.stderr
    bad = cli(redis7_server, prefix, "backfill", "reports", "nightly", "--start", "x", "--end", "y")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr

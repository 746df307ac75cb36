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


def test_show_and_list_read_msgpack_and_pickle_queues(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    """The CLI reads with the JSON codec, as its other views do: a msgpack payload decodes
    (its envelope says so), a pickled one shows as invalid (the CLI never unpickles), and
    neither stops the listing."""
    with DelayQueue("mp", redis7_server.url, prefix=prefix, codec="msgpack") as q:
        q.schedules.upsert("raw", {"blob": b"\x00\xff", "n": 1}, every=60)
    with DelayQueue("pk", redis7_server.url, prefix=prefix, codec="pickle") as q:
        q.schedules.upsert("set", {1, 2}, every=60)
        q.schedules.upsert("cron", "c", cron="0 9 * * *", tz="Europe/Berlin")
    shown = as_json(redis7_server, prefix, "show", "mp", "raw")
    assert shown["payload"] == {"blob": {"base64": "AP8="}, "n": 1}
    assert shown["payload_error"] is None
    assert '"n": 1' in ok(redis7_server, prefix, "show", "mp", "raw")
    listed = as_json(redis7_server, prefix, "list", "pk")
    assert [s["name"] for s in listed] == ["cron", "set"]
    bad = next(s for s in listed if s["name"] == "set")
    assert bad["payload"] is None and "pickled" in bad["payload_error"]
    text = ok(redis7_server, prefix, "show", "pk", "set")
    assert "invalid: task is pickled" in " ".join(text.split()), text
    assert "Traceback" not in text
    assert "cron" in ok(redis7_server, prefix, "list", "pk")


def test_show_names_the_tzdata_of_the_cron_times(redis7_server: EmbeddedRedis, prefix: str) -> None:
    from delayq._core.tzsource import tz_source

    with DelayQueue("reports", redis7_server.url, prefix=prefix) as q:
        q.schedules.upsert("nightly", "n", cron="30 2 * * *", tz="America/New_York")
        q.schedules.upsert("beat", "b", every=60)
    mine = tz_source("America/New_York")
    shown = as_json(redis7_server, prefix, "show", "reports", "nightly")
    assert (shown["tzdata"], shown["tzdata_source"]) == (mine.version, mine.source)
    text = " ".join(ok(redis7_server, prefix, "show", "reports", "nightly").split())
    assert f"tzdata {mine.version} ({mine.source})" in text, text
    assert as_json(redis7_server, prefix, "show", "reports", "beat")["tzdata"] is None


def test_reshard_command_carries_schedules(redis7_server: EmbeddedRedis, prefix: str) -> None:
    with DelayQueue("reports", redis7_server.url, prefix=prefix) as q:
        q.schedules.upsert("nightly", "n", cron="30 2 * * *", tz="America/New_York")
        q.schedules.upsert("beat", "b", every=3600)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    base = ["--redis", redis7_server.url, "--prefix", prefix]
    started = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "reshard", "reports", "--shards", "3", *base],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started
    assert "reports: 2 schedule(s) carried to the new layout" in started.stdout
    listed = as_json(redis7_server, prefix, "list", "reports")
    assert [(s["name"], s["version"]) for s in listed] == [("beat", 1), ("nightly", 1)]
    finished = subprocess.run(
        [sys.executable, "-m", "delayq.cli", "reshard", "reports", "--finish", "--grace", "0",
         *base],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert finished.returncode == 0, finished
    assert [s["name"] for s in as_json(redis7_server, prefix, "list", "reports")] == [
        "beat",
        "nightly",
    ]

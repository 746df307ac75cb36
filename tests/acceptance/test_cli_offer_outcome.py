"""``delayq offer --json`` says whether the offer created a task or found one (the CLI as a
subprocess, against a real Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from delayq.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[2]


def offer(server: EmbeddedRedis, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # never the machine's Redis
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", "offer", "orders", *args,
         "--redis", server.url, "--prefix", prefix],
        cwd=ROOT, env={**env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def offered(server: EmbeddedRedis, prefix: str, *args: str) -> dict[str, Any]:
    done = offer(server, prefix, *args, "--json")
    assert done.returncode == 0, done
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_offer_json_reports_created_existing_and_replaced(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    first = offered(redis7_server, prefix, '{"n": 1}', "-d", "1h", "--key", "close:1")
    assert first == {"id": first["id"], "outcome": "created", "created": True}
    kept = offered(redis7_server, prefix, '{"n": 2}', "-d", "1h", "--key", "close:1")
    assert kept == {"id": first["id"], "outcome": "existing", "created": False}
    replaced = offered(
        redis7_server, prefix, '{"n": 3}', "-d", "1h", "--key", "close:1", "--replace"
    )
    assert replaced == {"id": first["id"], "outcome": "replaced", "created": False}
    by_id = [offered(redis7_server, prefix, '"x"', "-d", "1h", "--id", "job-1") for _ in "ab"]
    assert [r["outcome"] for r in by_id] == ["created", "existing"]
    plain = offer(redis7_server, prefix, '"y"', "-d", "1h")  # without --json: the id alone
    assert plain.returncode == 0 and len(plain.stdout.strip()) == 14


def test_offer_of_another_payload_under_a_taken_id_fails_cleanly(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    offered(redis7_server, prefix, '"x"', "-d", "1h", "--id", "job-1")
    done = offer(redis7_server, prefix, '"other"', "-d", "1h", "--id", "job-1", "--json")
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.startswith("error: task id 'job-1' is held by a task with other content")
    assert "Traceback" not in done.stderr

"""The messages issue #22 found wrong, each through the real ``delayq`` command: what a user
reads must say what happened and what to do (requeue's arguments and outcomes, a busy port, a
corrupt task, ids at 80 columns, the --redis default ``--help`` shows).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from delayq import DelayQueue
from delayq._core.keys import QueueKeys
from delayq.embedded import EmbeddedRedis
from tests.acceptance.test_cli import ROOT, Result, cli_env, command, run_many


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_requeue_arguments_say_what_is_missing(target: list[str]) -> None:
    neither, both = run_many([["requeue", "q", *target], ["requeue", "q", "x", "--all", *target]])
    line = neither.failed_with("--all", code=2)
    assert "not both" not in line and "ids to requeue" in line
    both.failed_with("not both", code=2)


def test_requeue_counts_in_words_and_says_why_each_id_stayed(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("work", max_attempts=1)
    dead_one, live = q.offer({"n": 1}, key="k"), q.offer(2, delay=3600)
    task = q.poll()
    assert task is not None and task.id == dead_one
    q.reject(task, "boom")
    holder_of_key = q.offer({"n": 3}, key="k", delay=3600)  # takes the dead task's key
    assert holder_of_key != dead_one

    (missed,) = run_many([["requeue", "work", "nope", live, dead_one, *target]])
    line = missed.failed_with(code=1)
    assert "nope: no such task" in line, line
    assert f"{live}: not dead (it is delayed)" in line, line
    assert f"{dead_one}: a live task holds its dedup key 'k'" in line, line

    q.cancel(holder_of_key)
    (one,) = run_many([["requeue", "work", "--all", *target]])
    assert one.code == 0 and one.out.strip() == "requeued 1 dead task of work", one


def test_busy_port_names_the_address(busy_port: int, target: list[str]) -> None:
    exporter, dashboard = run_many(
        [
            ["exporter", "--port", str(busy_port), *target],
            ["dashboard", "--port", str(busy_port), *target],
        ],
        timeout=60,
    )
    for result in (exporter, dashboard):
        line = result.failed_with(code=1)
        assert f"cannot listen on 127.0.0.1:{busy_port}: address already in use" in line, result


def test_worker_metrics_on_a_busy_port_names_the_address(
    busy_port: int, target: list[str], tmp_path: Any
) -> None:
    (tmp_path / "handlers.py").write_text("def handle(task):\n    pass\n")
    env = cli_env(PYTHONPATH=f"{tmp_path}:{ROOT / 'src'}")
    args = ["worker", "handlers:handle", "-q", "q", "--metrics-port", str(busy_port), *target]
    proc = subprocess.run(command(*args), cwd=ROOT, env=env, text=True, capture_output=True,
                          timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    result = Result(args, proc.returncode, proc.stdout, proc.stderr)
    assert f"error: cannot listen on 127.0.0.1:{busy_port}: address already in use" in proc.stderr
    assert "Traceback" not in proc.stderr, result


def test_corrupt_task_on_a_json_queue_is_not_called_msgpack(
    redis7_server: EmbeddedRedis, prefix: str, queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    task_id = queue("q").offer({"a": 1}, delay=3600)
    raw = redis.Redis.from_url(redis7_server.url)
    raw.hset(QueueKeys(prefix, "q").key("tasks"), task_id, b"garbage")
    raw.close()
    (shown,) = run_many([["get", "q", task_id, "--json", *target]])
    error = shown.json()["last_error"]
    assert "not valid JSON" in error and "msgpack" not in error, error


def test_inspect_keeps_ids_on_one_line_at_80_columns(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("orders")
    ids = [q.offer({"order_id": 42, "note": "a longer payload " * 3}, delay=1800, key="close:42"),
           q.offer({"n": 1}), q.offer({"n": 2}, delay=60)]  # fmt: skip
    (listing,) = run_many([["inspect", "orders", *target]], env=cli_env(COLUMNS="80"))
    assert listing.code == 0, listing
    lines = listing.out.splitlines()
    assert all(len(line) <= 80 for line in lines), listing.out
    for task_id in ids:
        assert any(re.match(rf"\s*{re.escape(task_id)}\s", line) for line in lines), listing.out


def test_help_shows_the_default_redis_url_that_applies(redis7_server: EmbeddedRedis) -> None:
    secret = "redis://:hunter2@127.0.0.1:1/0"
    (with_env,) = run_many([["stats", "--help"]], env=cli_env(REDIS_URL=secret))
    (without,) = run_many([["stats", "--help"]])
    assert with_env.code == 0 and without.code == 0
    flat = " ".join(with_env.out.split())
    assert "redis://:***@127.0.0.1:1/0" in flat and "hunter2" not in flat, with_env.out
    assert "6379" not in flat, with_env.out
    assert "$REDIS_URL, else redis://127.0.0.1:6379/0" in " ".join(without.out.split())


def test_typed_payload_error_names_the_payload_path_not_the_envelope() -> None:
    # Offering happens in the caller's code, not in a command: this runs it as a program.
    program = """
from dataclasses import dataclass
from delayq._core.codecs import PayloadType
from delayq._core.envelope import EnvelopeCodec
from delayq.exceptions import EncodeError

@dataclass
class Order:
    order_id: int

for codec in ("json", "msgpack"):
    try:
        EnvelopeCodec(codec, PayloadType(Order)).encode(Order("42"))
    except EncodeError as exc:
        print(exc)
"""
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc
    for line in lines:
        assert line.endswith("at `$.order_id`"), line


def test_redis_url_from_an_environment_variable_or_a_file(
    queue: Callable[..., DelayQueue], redis7_server: EmbeddedRedis, prefix: str, tmp_path: Any
) -> None:
    # issue #23: a URL with a password given as --redis shows in ps; env:NAME and file:PATH
    # keep it out of the command line, on every command that takes --redis.
    queue("orders").offer({"n": 1}, 3600)
    secret = tmp_path / "redis-url"
    secret.write_text(redis7_server.url + "\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    env = cli_env(DQ_TEST_URL=redis7_server.url)
    from_env, from_file, unset, missing, blank = run_many(
        [
            ["stats", "orders", "--json", "--redis", "env:DQ_TEST_URL", "--prefix", prefix],
            ["stats", "orders", "--json", "--redis", f"file:{secret}", "--prefix", prefix],
            ["stats", "orders", "--redis", "env:DQ_TEST_NOT_SET", "--prefix", prefix],
            ["stats", "orders", "--redis", f"file:{tmp_path / 'nope'}", "--prefix", prefix],
            ["queues", "--redis", f"file:{empty}", "--prefix", prefix],
        ],
        env=env,
    )
    for result in (from_env, from_file):
        assert result.json()[0]["delayed"] == 1, result
    unset.failed_with("env:DQ_TEST_NOT_SET: the environment variable is not set", code=2)
    missing.failed_with("No such file or directory", code=2)
    blank.failed_with("the file is empty", code=2)

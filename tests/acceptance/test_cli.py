"""The ``delayq`` command line, run as a user runs it: a subprocess per command, against the
test's own redis-server and key prefix (never the machine's Redis).

The CLI does not depend on the Redis version (the scripts it calls are tested on every version
in tests/integration), so these tests use the newest server only. Independent invocations run
in parallel to keep the suite short.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayq import DelayQueue, Offer, TaskState
from delayq.cli import main
from delayq.embedded import EmbeddedRedis, free_port

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["offer", "stats", "queues", "inspect", "get", "history", "cancel", "reschedule",
            "dead", "requeue", "purge", "demo", "worker"]  # fmt: skip


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", **extra}
    if "REDIS_URL" not in extra:
        env.pop("REDIS_URL", None)  # the test's server, never the machine's Redis
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "delayq.cli", *args]


@dataclass
class Result:
    args: Sequence[str]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self
        return json.loads(self.out)

    def failed_with(self, *fragments: str, code: int | None = None) -> str:
        """Assert a clean failure: non-zero exit, one line on stderr, no traceback."""
        assert self.code != 0 if code is None else self.code == code, self
        lines = self.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), self
        assert "Traceback" not in self.err + self.out, self
        for fragment in fragments:
            assert fragment in lines[0], self
        return lines[0]


Run = Callable[..., Result]


def run_many(invocations: Sequence[Sequence[str]], env: dict[str, str] | None = None,
             timeout: float = 60) -> list[Result]:  # fmt: skip
    """Run the CLI once per argument list, all at once; results in order."""
    procs = [
        subprocess.Popen(command(*args), cwd=ROOT, env=env or cli_env(), text=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for args in invocations
    ]  # fmt: skip
    results = []
    for args, proc in zip(invocations, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        results.append(Result(args, proc.returncode, out, err))
    return results


@pytest.fixture
def dq(target: list[str]) -> Run:
    """Run one CLI command against the test's server and prefix."""

    def run(*args: str, timeout: float = 60) -> Result:
        return run_many([[*args, *target]], timeout=timeout)[0]

    return run


def ms(dt: datetime | None) -> int:
    assert dt is not None
    return round(dt.timestamp() * 1000)


# -- help --------------------------------------------------------------------------------------


def test_every_command_has_help_with_an_example() -> None:
    results = run_many([["--help"], *([name, "--help"] for name in COMMANDS)])
    top = results[0]
    assert top.code == 0 and all(name in top.out for name in COMMANDS), top
    for name, result in zip(COMMANDS, results[1:], strict=True):
        assert result.code == 0, result
        assert f"Example: delayq {name}" in result.out, result
        assert "--redis" in result.out or name == "demo", result
    bare = run_many([[]])[0]  # no command: the overview
    assert bare.code == 0 and "offer" in bare.out


# -- producing and reading ---------------------------------------------------------------------


def test_offer_get_inspect_and_queues(
    dq: Run, queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    at = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    plain, keyed, timed, named = run_many([
        ["offer", "orders", '{"order_id": 1}', "--delay", "1h30m", *target],
        ["offer", "orders", '{"order_id": 2}', "--delay", "0", "--key", "close:2",
         "--priority", "7", "-H", "trace=abc", "--header", "tenant=t=1", "--ttl", "10m",
         "--json", *target],
        ["offer", "orders", "[1, 2]", "--at", at.isoformat(), *target],
        ["offer", "emails", '"hi"', "-d", "250ms", "--id", "mail-1", *target],
    ])  # fmt: skip
    assert plain.code == 0 and len(plain.out.split()) == 1, plain
    plain_id = plain.out.strip()
    keyed_id = keyed.json()["id"]
    assert named.out.strip() == "mail-1", named

    q = queue("orders")
    info = q.get(plain_id)
    assert info is not None and info.payload == {"order_id": 1}
    assert 5395 < (ms(info.due_at) / 1000 - time.time()) <= 5400
    keyed_info = q.get(keyed_id)
    assert keyed_info is not None and keyed_info.state is TaskState.READY
    assert keyed_info.key == "close:2" and keyed_info.priority == 7
    assert dict(keyed_info.headers) == {"trace": "abc", "tenant": "t=1"}
    assert ms(keyed_info.expires_at) == ms(keyed_info.due_at) + 600_000
    timed_info = q.get(timed.out.strip())
    assert timed_info is not None and timed_info.due_at == at and timed_info.payload == [1, 2]

    again, got, got_table, ready, everything, table, names, names_table = run_many([
        ["offer", "orders", '{"order_id": 99}', "-d", "5", "--key", "close:2", *target],
        ["get", "orders", keyed_id, "--json", *target],
        ["get", "orders", keyed_id, *target],
        ["inspect", "orders", "--state", "ready", "--json", *target],
        ["inspect", "orders", "--json", *target],
        ["inspect", "orders", "--limit", "1", *target],
        ["queues", "--json", *target],
        ["queues", *target],
    ])  # fmt: skip
    assert again.out.strip() == keyed_id  # dedup: the live task's id
    doc = got.json()
    assert doc["id"] == keyed_id and doc["state"] == "ready" and doc["key"] == "close:2"
    assert doc["payload"] == {"order_id": 2} and doc["headers"]["tenant"] == "t=1"
    assert datetime.fromisoformat(doc["due_at"]) == keyed_info.due_at
    assert got_table.code == 0 and "close:2" in got_table.out and "order_id" in got_table.out
    assert [t["id"] for t in ready.json()] == [keyed_id]
    by_state = {t["id"]: t["state"] for t in everything.json()}
    assert by_state == {keyed_id: "ready", plain_id: "delayed", timed.out.strip(): "delayed"}
    assert table.code == 0 and keyed_id in table.out and plain_id in table.out
    assert names.json() == ["emails", "orders"]
    assert names_table.out.split() == ["emails", "orders"]


def test_stats_table_json_and_watch(
    dq: Run, queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    a = queue("alpha", overdue_after=0.001)
    a.offer_many([Offer(i, 0) for i in range(3)] + [Offer(i, 60) for i in range(2)])
    b = queue("beta", max_attempts=1)
    b.offer("x", 0)
    task = b.poll(1)
    assert task is not None
    task.retry(error="boom")
    time.sleep(0.01)

    every, some, table, empty = run_many([
        ["stats", "--json", "--overdue-after", "1ms", *target],
        ["stats", "beta", "--json", *target],
        ["stats", *target],
        ["stats", "--json", "--redis", target[1], "--prefix", target[3] + "x"],
    ])  # fmt: skip
    rows = {r["queue"]: r for r in every.json()}
    assert set(rows) == {"alpha", "beta"}
    assert (rows["alpha"]["ready"], rows["alpha"]["delayed"], rows["alpha"]["dead"]) == (3, 2, 0)
    assert rows["alpha"]["overdue"] == 3 and rows["alpha"]["oldest_overdue_age"] > 0
    assert rows["alpha"]["next_due_at"] and rows["alpha"]["counters"]["offered"] == 5
    assert rows["beta"]["dead"] == 1 and rows["beta"]["total"] == 1
    assert [r["queue"] for r in some.json()] == ["beta"]
    assert table.code == 0 and "alpha" in table.out and "inflight" in table.out, table
    assert "offered=5" in table.out
    assert empty.json() == []

    # --watch --json: one line per refresh until Ctrl-C, which ends it cleanly.
    proc = subprocess.Popen(
        command("stats", "alpha", "--watch", "--interval", "0.1", "--json", *target),
        cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    a.offer("more", 60)
    deadline = time.monotonic() + 10
    while json.loads(line := proc.stdout.readline())[0]["delayed"] != 3:
        assert time.monotonic() < deadline
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert all(json.loads(x)[0]["queue"] == "alpha" for x in [*lines, line])

    # The table form refreshes too (printed anew when stdout is not a terminal).
    proc = subprocess.Popen(
        command("stats", "--watch", "--interval", "0.1", *target),
        cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    seen = ""
    while seen.count("delayq stats") < 2:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=10)
    assert proc.returncode == 0 and "beta" in seen


# -- fixing ------------------------------------------------------------------------------------


def test_cancel_and_reschedule(
    dq: Run, queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("jobs", visibility_timeout=60)
    one, two, three = q.offer_many([Offer("a", 30), Offer("b", 30), Offer("c", 30)])
    leased = q.offer("d", 0)
    assert q.poll(1) is not None
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)

    cancelled, partly, later, busy, busy_cancel = run_many([
        ["cancel", "jobs", one, *target],
        ["cancel", "jobs", two, "no-such-id", "--json", *target],
        ["reschedule", "jobs", three, "--delay", "2h", "--json", *target],
        ["reschedule", "jobs", leased, "--delay", "1s", *target],
        ["cancel", "jobs", leased, *target],
    ])  # fmt: skip
    assert cancelled.code == 0 and cancelled.out.strip() == f"cancelled {one}"
    assert json.loads(partly.out) == {"cancelled": [two], "missed": ["no-such-id"]}
    partly.failed_with("no-such-id", code=1)
    assert q.get(one) is None and q.get(two) is None
    due = datetime.fromisoformat(later.json()["due_at"])
    assert 7190 < due.timestamp() - time.time() <= 7200
    info = q.get(three)
    assert info is not None and info.due_at == due
    busy.failed_with("not waiting", code=1)
    busy_cancel.failed_with(leased, code=1)

    final = dq("reschedule", "jobs", three, "--at", "2031-05-06T09:08:09+02:00")
    assert final.code == 0 and "2031-05-06 07:08:09Z" in final.out, final
    info = q.get(three)
    assert info is not None and info.due_at == at


def test_dead_requeue_and_purge(
    dq: Run, queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("work", max_attempts=1)
    ids = q.offer_many([Offer({"n": i}, 0, key=f"k{i}") for i in range(1203)])
    while tasks := q.poll_many(1000):
        for t in tasks:
            q.reject(t, f"failed {t.payload['n']}")
    assert q.stats().dead == 1203

    listed, listed_table = run_many([
        ["dead", "work", "--limit", "3", "--offset", "1", "--json", *target],
        ["dead", "work", "--limit", "2", *target],
    ])  # fmt: skip
    rows = listed.json()
    assert [r["id"] for r in rows] == [t.id for t in q.dead(limit=3, offset=1)]
    assert rows[0]["error"].startswith("failed") and rows[0]["attempts"] == 1
    assert "failed" in listed_table.out and listed_table.code == 0

    some = dq("requeue", "work", ids[0], ids[1], "--json")
    assert some.json() == {"requeued": [ids[0], ids[1]], "missed": []}
    missed = dq("requeue", "work", ids[0], ids[2])  # ids[0] is no longer dead
    missed.failed_with(ids[0], code=1)
    assert missed.out.strip() == f"requeued {ids[2]}"

    everything = dq("requeue", "work", "--all")
    assert everything.code == 0 and "requeued 1200 dead tasks" in everything.out, everything
    stats = q.stats()
    assert (stats.dead, stats.ready) == (0, 1203)

    for t in q.poll_many(1000) + q.poll_many(1000):
        q.reject(t, "again")
    refused, wrong_state, purged = run_many([
        ["purge", "work", *target],  # stdin is not a terminal and no --yes
        ["purge", "work", "--state", "zombie", "--yes", *target],
        ["purge", "work", "--yes", "--json", *target],
    ])  # fmt: skip
    refused.failed_with("--yes", code=2)
    wrong_state.failed_with("--state", code=2)
    assert purged.json() == {"purged": 1203, "states": ["dead"]}
    assert q.stats().total == 0
    assert q.offer("new", 0, key="k0") not in ids  # purge released the dedup keys


def test_purge_asks_for_confirmation_on_a_terminal(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("confirm")
    q.offer_many([Offer(i, 0) for i in range(2)] + [Offer(i, 60) for i in range(3)])

    def purge_answering(answer: bytes, *states: str) -> tuple[int, str]:
        master, slave = pty.openpty()
        proc = subprocess.Popen(
            command("purge", "confirm", *states, *target), cwd=ROOT, env=cli_env(),
            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        os.close(slave)
        assert proc.stdout is not None
        prompt = b""
        while b"?" not in prompt:
            assert select.select([proc.stdout], [], [], 10)[0], f"no prompt: {prompt!r}"
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, f"no prompt: {prompt!r}"
            prompt += chunk
        os.write(master, answer + b"\n")
        out, _ = proc.communicate(timeout=10)
        os.close(master)
        text = (prompt + out).decode()
        assert "Delete" in text and "tasks from 'confirm'?" in text, text
        return proc.returncode, text

    code, text = purge_answering(b"n", "--state", "delayed")
    assert code == 1 and "nothing deleted" in text and q.stats().total == 5
    code, text = purge_answering(b"y", "--state", "delayed", "--state", "ready")
    assert code == 0 and "purged 5" in text and q.stats().total == 0


# -- errors --------------------------------------------------------------------------------------


def test_bad_arguments_fail_with_one_clear_line(
    target: list[str], tmp_path: Path, queue: Callable[..., DelayQueue]
) -> None:
    queue("q").offer("exists", 3600)  # a known queue: the errors below are about the task
    (tmp_path / "handlers.py").write_text("def handle(task):\n    pass\n")
    (tmp_path / "broken.py").write_text("import no_such_dependency_xyz\n")
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    cases: list[tuple[list[str], int, str]] = [
        (["offer", "q", "{oops", "-d", "1", *target], 2, "not valid JSON"),
        (["offer", "q", "1", "-d", "soon", *target], 2, "not a duration"),
        (["offer", "q", "1", "--at", "2030-01-01T00:00:00", *target], 2, "timezone"),
        (["offer", "q", "1", *target], 2, "--delay"),
        (["offer", "q", "1", "-d", "1", "--priority", "10", *target], 2, "--priority"),
        (["offer", "bad name", "1", "-d", "1", *target], 2, "invalid queue name"),
        (["offre", "q", "1", *target], 2, "offre"),
        (["get", "q", "no-such-task", *target], 1, "no task 'no-such-task'"),
        (["reschedule", "q", "no-such-task", "-d", "1m", *target], 1, "not waiting"),
        (["cancel", "q", *target], 2, "Missing argument"),
        (["requeue", "q", *target], 2, "--all"),
        (["requeue", "q", "never-dead", *target], 1, "never-dead"),
        (["inspect", "q", "--state", "sleeping", *target], 2, "--state"),
        (["dead", "q", "--limit", "many", *target], 2, "--limit"),
        (["stats", "--interval", "0", *target], 2, "--interval"),
        (["demo", "--orders", "0"], 2, "--orders"),
        (["worker", "nomodule_xyz:handle", "-q", "q", *target], 2, "no module named"),
        (["worker", "handlers:missing", "-q", "q", *target], 2, "no attribute 'missing'"),
        (["worker", "broken:handle", "-q", "q", *target], 2, "no_such_dependency_xyz"),
        # Redis unreachable, or not a Redis URL at all
        (["queues", "--redis", dead_url], 1, "127.0.0.1"),
        (["stats", "q", "--redis", dead_url], 1, "unreachable"),
        (["offer", "q", "1", "-d", "1", "--redis", dead_url], 1, "unreachable"),
        (["queues", "--redis", "http://example.invalid"], 2, "--redis"),
        (["queues", "--redis", target[1], "--prefix", "bad prefix!"], 2, "prefix"),
    ]
    env = cli_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    results = run_many([args for args, _, _ in cases], env=env)
    for result, (_, code, text) in zip(results, cases, strict=True):
        result.failed_with(text, code=code)


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["offer", "q", "1", "-d", "-5s"], "negative"),
        (["offer", "q", "1", "-d", "1h1h"], "not a duration"),
        (["offer", "q", "1", "-d", "nan"], "not a duration"),
        (["offer", "q", "1", "-d", "1e400"], "not a duration"),
        (["offer", "q", "1", "-d", "200y"], "not a duration"),
        (["offer", "q", "1", "-d", ""], "not a duration"),
        (["offer", "q", "1", "-d", "99999999999"], "century"),
        (["offer", "q", "1", "--at", "tomorrow"], "ISO 8601"),
        (["offer", "q", "1", "-d", "1", "--at", "2030-01-01T00:00:00Z"], "not both"),
        (["offer", "q", "1", "-d", "1", "-H", "novalue"], "name=value"),
        (["offer", "q", "1", "-d", "1", "--ttl", "forever"], "--ttl"),
        (["offer", "q"], "PAYLOAD_JSON"),
        (["reschedule", "q", "some-id"], "--delay"),
        (["requeue", "q", "x", "--all"], "--all"),
        (["inspect", "q", "--limit", "-1"], "--limit"),
        (["stats", "q", "--overdue-after", "later"], "--overdue-after"),
        (["worker", "handlers:value", "-q", "q"], "not callable"),
        (["worker", "handlers", "-q", "q"], "module:function"),
        (["worker", "handlers:handle"], "--queue"),
        (["worker", "handlers:handle", "-q", "q", "--visibility-timeout", "x"], "duration"),
        (["worker", "handlers:handle", "-q", "q", "--log-level", "LOUD"], "--log-level"),
    ],
)
def test_more_bad_arguments(
    args: list[str],
    text: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Further argument errors, found before any Redis call: checked in-process (the same
    ``main`` the subprocess runs) to keep the suite fast."""
    (tmp_path / "handlers.py").write_text("def handle(task):\n    pass\nvalue = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("REDIS_URL", raising=False)
    code = main([*args, "--redis", "redis://127.0.0.1:1/0"])
    captured = capsys.readouterr()
    Result(args, code, captured.out, captured.err).failed_with(text, code=2)


def test_redis_url_comes_from_the_environment(
    redis7_server: EmbeddedRedis, prefix: str, queue: Callable[..., DelayQueue]
) -> None:
    queue("from-env").offer("x", 5)
    env = cli_env(REDIS_URL=redis7_server.url)
    result = run_many([["queues", "--json", "--prefix", prefix]], env=env)[0]
    assert result.json() == ["from-env"]


# -- running ---------------------------------------------------------------------------------------


def test_demo_runs(redis7_server: EmbeddedRedis) -> None:
    result = run_many([["demo", "--orders", "8", "--spread", "0.3", "--redis", redis7_server.url]])[
        0
    ]
    assert result.code == 0, result
    assert "OK" in result.out and "MISMATCH" not in result.out

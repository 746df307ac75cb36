"""The ``delayq`` command's views hold against what Redis may hold: long names at 80 columns,
misspelt queues, tracebacks, rich markup, terminal escape sequences, deep or odd data, huge
pages, and passwords in URLs (issues #13 and #14). Each command runs as a subprocess, on a pipe
or on a pseudo-terminal (where rich draws its tables), against the test's own redis-server.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import os
import pty
import re
import select
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import redis

from delayq import DelayQueue, Offer
from delayq._core.handling import describe
from delayq._core.keys import QueueKeys
from delayq._sync.reshard import reshard
from delayq.cli import main
from delayq.embedded import EmbeddedRedis, free_port
from tests.acceptance.test_cli import ROOT, Result, cli_env, command, run_many

# Sequences that must never reach a terminal raw: colour, clear screen, a window title (OSC),
# a hyperlink (OSC 8), the C1 CSI, a bell, and bidi overrides/isolates.
HOSTILE = "\x1b[31mred\x1b[2J\x1b]0;title\x07\x9b\u202eevil\u2066"
RAW = ["\x1b[31m", "\x1b[2J", "\x1b]0;", "\x1b]8;", "\x07", "\x9b", "\u202e", "\u2066"]


@pytest.fixture
def raw(redis7_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis7_server.url)
    yield client
    client.close()


def piped(*args: str, columns: int = 80) -> Result:
    return run_many([args], env=cli_env(COLUMNS=str(columns)))[0]


def on_terminal(*args: str, columns: int = 80, timeout: float = 30) -> Result:
    """Run with stdout on a pseudo-terminal of ``columns`` columns (stderr on a pipe)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        command(*args), cwd=ROOT, env=cli_env(COLUMNS=str(columns), TERM="xterm-256color"),
        stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"{args} did not finish"
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                chunk = b""
            if not chunk:
                break
            chunks.append(chunk)
        elif proc.poll() is not None:
            break
    os.close(master)
    _, err = proc.communicate(timeout=timeout)
    return Result(args, proc.returncode, b"".join(chunks).decode(), err.decode())


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def visible(text: str) -> str:
    """What a terminal shows: the styling rich adds removed, lines without the pty's \\r."""
    return ANSI.sub("", text).replace("\r\n", "\n")


# -- version and help ----------------------------------------------------------------------------


def test_version_is_the_installed_distributions() -> None:
    result = piped("--version")
    assert result.code == 0, result
    assert result.out == f"delayq {importlib.metadata.version('delayq')}\n"


def every_command() -> list[list[str]]:
    """The path of every command and group, nested ones included (``outbox status``)."""
    import typer

    from delayq.cli.app import app

    def walk(group: Any, path: list[str]) -> Iterator[list[str]]:
        for name, sub in getattr(group, "commands", {}).items():
            yield [*path, name]
            yield from walk(sub, [*path, name])

    return list(walk(typer.main.get_command(app), []))


HELP_COMMANDS = [" ".join(path) for path in every_command()]


def test_help_at_80_columns_shows_no_type_noise(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every help page, in-process (the same ``main`` as the command; 20 pages would take
    half a minute as subprocesses)."""
    assert {"stats", "inspect", "prune", "dead"} <= set(HELP_COMMANDS)
    monkeypatch.setenv("COLUMNS", "80")
    results = []
    for args in [["--help"], *([*name.split(), "--help"] for name in HELP_COMMANDS)]:
        code = main(args)
        captured = capsys.readouterr()
        results.append(Result(args, code, captured.out, captured.err))
    for result in results:
        assert result.code == 0, result
        text = result.out
        for noise in ("<bool>", "<list", "<str>", "<int", "<float", "{QUEUE}", "[x>=", "<=x"):
            assert noise not in text, (noise, result.args, text)
        assert all(len(line) <= 80 for line in text.splitlines()), text
        # A choice list is never wrapped mid-word (it was "infligh" / "t|dead").
        assert not re.search(r"infligh(?!t)", text), text
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert "{" not in usage and "[[" not in usage, usage
    inspect = results[1 + HELP_COMMANDS.index("inspect")].out
    assert "STATE" in inspect and "inflight" in inspect and "10000" in inspect
    top = results[0].out
    assert "--version" in top and "prune" in top
    redis_help = " ".join(results[1 + HELP_COMMANDS.index("stats")].out.split())
    assert "shows in ps" in redis_help and "REDIS_URL" in redis_help


# -- stats never cuts a name ----------------------------------------------------------------

LONG_NAMES = [
    "mismatch-between-orders-and-payments-daily",
    "mismatch-between-orders-and-refunds-daily",
]


def queue_column(text: str) -> list[str]:
    """The queue column of the first table in ``text``, its folded lines joined."""
    lines = visible(text).splitlines()
    header = next(i for i, line in enumerate(lines) if "queue" in line and "delayed" in line)
    width = lines[header].index("delayed")
    fragments = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        fragments.append(line[:width].strip())
    return fragments


def test_stats_never_cuts_a_queue_name(queue: Callable[..., DelayQueue], target: list[str]) -> None:
    for name in LONG_NAMES:
        queue(name).offer_many([Offer(i, 60) for i in range(3)])
    table = on_terminal("stats", *target)
    assert table.code == 0, table
    shown = visible(table.out)
    assert "…" not in shown, shown
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert "".join(queue_column(table.out)) == "".join(LONG_NAMES), shown

    plain = piped("stats", *target)
    assert plain.code == 0, plain
    for name in LONG_NAMES:
        (line,) = [x for x in plain.out.splitlines() if name in x]  # `| grep name` finds it
        assert line.split()[:3] == [name, "3", "0"], line
    assert "…" not in plain.out and "\x1b" not in plain.out

    doc = piped("stats", "--json", *target).json()
    assert sorted(r["queue"] for r in doc) == LONG_NAMES


# -- unknown queues -------------------------------------------------------------------------------


def test_a_misspelt_queue_is_an_error(
    queue: Callable[..., DelayQueue], target: list[str], raw: redis.Redis, prefix: str
) -> None:
    queue("orders").offer("x", 60)
    raw.sadd(f"{prefix}:queues", "registered-only")  # listed, no keys yet: known
    raw.hset(QueueKeys(prefix, "keys-only").key("counters"), "offered", 1)  # keys, unlisted
    cases = [
        ["stats", "ordres", *target],
        ["inspect", "ordres", *target],
        ["dead", "ordres", *target],
        ["get", "ordres", "some-id", *target],
        ["cancel", "ordres", "some-id", *target],
        ["reschedule", "ordres", "some-id", "-d", "1m", *target],
        ["requeue", "ordres", "--all", *target],
        ["purge", "ordres", "--yes", *target],
    ]
    for result in run_many(cases):
        line = result.failed_with("unknown queue 'ordres'", code=1)
        assert "did you mean 'orders'" in line, line

    allowed = run_many([
        ["stats", "ordres", "--allow-missing", "--json", *target],
        ["inspect", "ordres", "--allow-missing", "--json", *target],
        ["dead", "ordres", "--allow-missing", "--json", *target],
        ["stats", "registered-only", "keys-only", "--json", *target],
        ["dead", "registered-only", "--json", *target],
        ["dead", "keys-only", "--json", *target],
    ])  # fmt: skip
    assert allowed[0].json()[0]["total"] == 0
    assert allowed[1].json() == [] and allowed[2].json() == []
    assert [r["queue"] for r in allowed[3].json()] == ["registered-only", "keys-only"]
    assert allowed[4].json() == [] and allowed[5].json() == []


# -- dead letters show the last line -------------------------------------------------------------


def failing_handler(order: int) -> None:
    raise RuntimeError(f"boom: the payment service answered 503 for order {order}")


def test_dead_shows_the_exceptions_last_line_and_get_the_traceback(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("payments", max_attempts=1)
    ids = q.offer_many([Offer({"order": n}, 0) for n in range(5)])
    while tasks := q.poll_many(10):
        for task in tasks:
            try:
                failing_handler(task.payload["order"])
            except RuntimeError as exc:
                q.reject(task, describe(exc))  # what a worker records: the traceback
    assert q.stats().dead == 5

    for result in (piped("dead", "payments", *target), on_terminal("dead", "payments", *target)):
        assert result.code == 0, result
        shown = visible(result.out)
        assert "Traceback" not in shown and "File " not in shown, shown
        assert shown.count("RuntimeError: boom") == 5, shown
        assert all(len(line) <= 80 for line in shown.splitlines()), shown
        lines = shown.strip().splitlines()
        rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
        body = [line for line in lines[rule + 1 :] if line.strip()]
        assert len(body) <= 2 * 5, shown  # one or two lines per task

    full = piped("get", "payments", ids[0], *target, columns=120)
    assert full.code == 0, full
    assert "Traceback (most recent call last)" in full.out and "failing_handler" in full.out
    assert "RuntimeError: boom: the payment service answered 503 for order 0" in full.out
    doc = piped("dead", "payments", "--json", "--limit", "1", *target).json()
    assert doc[0]["error"].startswith("Traceback (most recent call last)")


# -- markup and escape sequences -----------------------------------------------------------------


def test_markup_in_names_and_counters_is_shown_not_interpreted(
    queue: Callable[..., DelayQueue], target: list[str], raw: redis.Redis, prefix: str
) -> None:
    q = queue("plain")
    q.offer("x", 60)
    raw.sadd(f"{prefix}:queues", "[/]broken", "[link=http://x]click[/link]", "emoji:smile:")
    counters = QueueKeys(prefix, "plain").key("counters")
    raw.hset(counters, mapping={"[/]": 1, "[link=http://x]here": 2, "[bold red]loud": 3})

    runs = [
        piped("queues", *target), on_terminal("queues", *target),
        piped("stats", *target), on_terminal("stats", *target),
        on_terminal("stats", *target, columns=160),
        piped("stats", "plain", "--json", *target),
    ]  # fmt: skip
    for result in runs:
        assert result.code == 0, result
        assert "MarkupError" not in result.err and "\x1b]8;" not in result.out, result
    for result in runs[2:5]:
        shown = " ".join(visible(result.out).split())
        assert "[/]=1" in shown and "[link=http://x]here=2" in shown, shown
        assert "[bold red]loud=3" in shown, shown
    warned = runs[0].err + runs[2].err
    assert "[link=http://x]click[/link]" in warned and "[/]broken" in warned, warned
    # ":smile:" in a valid name is not an emoji code to rich.
    assert "emoji:smile:" in runs[0].out and "emoji:smile:" in visible(runs[3].out), runs[0]
    assert runs[5].json()[0]["counters"]["[/]"] == 1
    offered = piped("offer", "plain", "1", "-d", "60", "--id", "[b]x:smile:", *target)
    assert offered.out == "[b]x:smile:\n", offered


def test_escape_sequences_from_redis_never_reach_the_terminal(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    q = queue("hostile", max_attempts=1)
    task_id = q.offer(
        {"note": HOSTILE},
        0,
        id=f"id-{HOSTILE}",
        key=f"key-{HOSTILE}",
        headers={f"h-{HOSTILE}": f"v-{HOSTILE}"},
    )
    task = q.poll(1)
    assert task is not None and task.id == task_id
    q.reject(task, f"RuntimeError: {HOSTILE}")

    views = [
        ["inspect", "hostile", *target],
        ["get", "hostile", task_id, *target],
        ["dead", "hostile", *target],
    ]
    for args in views:
        for result in (piped(*args, columns=200), on_terminal(*args, columns=200)):
            assert result.code == 0, result
            for sequence in RAW:
                assert sequence not in result.out, (sequence, result)
            assert "\\x1b[31mred" in result.out, result  # shown escaped, readable
            assert "\\u202eevil" in result.out, result
    assert "\x1b" not in piped("get", "hostile", task_id, *target).out  # no styling on a pipe

    # --json stays exact (the very characters) yet carries no raw escape character.
    for args in (["get", "hostile", task_id, "--json"], ["dead", "hostile", "--json"]):
        result = piped(*args, *target)
        assert result.out.isascii(), result
        doc = result.json()
        row = doc if isinstance(doc, dict) else doc[0]
        assert row["id"] == task_id and row["payload"] == {"note": HOSTILE}
    info = piped("get", "hostile", task_id, "--json", *target).json()
    assert info["key"] == f"key-{HOSTILE}" and info["headers"] == {f"h-{HOSTILE}": f"v-{HOSTILE}"}
    assert info["last_error"] == f"RuntimeError: {HOSTILE}"

    # An error message quoting a hostile argument is escaped too.
    failed = piped("get", "hostile", f"nope-{HOSTILE}", *target)
    line = failed.failed_with("no task", code=1)
    assert all(sequence not in line for sequence in RAW), line


# -- odd data -------------------------------------------------------------------------------------


def test_a_payload_nested_950_deep_prints(
    queue: Callable[..., DelayQueue], target: list[str]
) -> None:
    deep: list[Any] = []
    inner = deep
    for _ in range(949):
        inner.append([])
        inner = inner[0]
    q = queue("deep", max_attempts=1)

    def produce() -> tuple[str, str]:
        # In a thread of its own, as a producer runs it: the encoder's depth limit counts the
        # caller's frames too, and pytest's (more under xdist) would use up ~80 of 1,000.
        task_id = q.offer(deep, 3600)  # accepted by offer, so it must be viewable
        dead_id = q.offer({"wrapped": deep}, 0)
        task = q.poll(1)
        assert task is not None and task.id == dead_id
        q.reject(task, "too deep")
        return task_id, dead_id

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        task_id, dead_id = pool.submit(produce).result(timeout=30)

    got, got_json, inspected, inspected_json, dead = run_many([
        ["get", "deep", task_id, *target],
        ["get", "deep", task_id, "--json", *target],
        ["inspect", "deep", *target],
        ["inspect", "deep", "--json", *target],
        ["dead", "deep", *target],
    ])  # fmt: skip
    for result in (got, inspected, dead):
        assert result.code == 0 and "RecursionError" not in result.err, result
        assert "[[[[" in result.out, result
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # deep JSON: a shallow stack
        payload = pool.submit(lambda: got_json.json()["payload"] == deep).result(timeout=30)
        ids = pool.submit(lambda: {t["id"] for t in inspected_json.json()}).result(timeout=30)
    assert payload and ids == {task_id, dead_id}


def test_msgpack_headers_with_odd_keys_and_binary_values_show_safely(
    queue: Callable[..., DelayQueue], target: list[str], raw: redis.Redis, prefix: str
) -> None:
    q = queue("odd")
    task_id = q.offer("placeholder", 3600)
    envelope = msgpack.packb(
        {"p": {"n": 1}, "c": "msgpack", "h": {1: "int key", b"\xff\x1b[2J": "bytes key"}},
        use_bin_type=True,
    )
    raw.hset(QueueKeys(prefix, "odd").key("tasks"), task_id, envelope)  # another producer's
    shown, as_json = run_many([["get", "odd", task_id, *target], ["get", "odd", task_id,
                                                                  "--json", *target]])  # fmt: skip
    assert shown.code == 0 and "int key" in shown.out and "\x1b[2J" not in shown.out, shown
    doc = as_json.json()
    assert doc["payload"] == {"n": 1} and doc["headers"]["1"] == "int key"


def test_a_task_id_that_is_not_utf8_shows_safely(
    queue: Callable[..., DelayQueue], target: list[str], raw: redis.Redis, prefix: str
) -> None:
    q = queue("binary")
    q.offer("fine", 3600)
    keys = QueueKeys(prefix, "binary")
    # Another client writes a task whose id is not UTF-8, scored like any delayed task.
    score = raw.zrange(keys.key("delayed"), 0, 0, withscores=True)[0][1]
    raw.hset(keys.key("tasks"), b"bad-\xff\x1b[2J", b'="odd"')
    raw.zadd(keys.key("delayed"), {b"bad-\xff\x1b[2J": score})
    shown, as_json = run_many([["inspect", "binary", *target],
                               ["inspect", "binary", "--json", *target]])  # fmt: skip
    assert shown.code == 0, shown
    assert "bad-" in shown.out and "\\x1b[2J" in shown.out and "\x1b[2J" not in shown.out, shown
    assert len(as_json.json()) == 2


# -- bounds and secrets ---------------------------------------------------------------------------


def test_limits_are_bounded(target: list[str]) -> None:
    results = run_many([
        ["dead", "q", "--limit", "10001", *target],
        ["inspect", "q", "--limit", "10001", *target],
    ])  # fmt: skip
    for result in results:
        result.failed_with("--limit", "10000", code=2)


# (url, what must not show, whether the URL itself is refused: then every command that
# takes --redis fails at once, the long-running ones included).
SECRET_URLS = [
    ("redis://u:pa/ss@127.0.0.1:{port}/0", ["pa/ss", "ss@", "pa/"], True),
    ("redis://u:p@ss@127.0.0.1:{port}/0", ["p@ss"], False),
    ("redis://u:s3cret@127.0.0.1:{port}/0", ["s3cret"], False),
    ("redis://127.0.0.1:{port}/0?password=s3cret", ["s3cret"], False),
    ("unix:///tmp/delayq-no-such.sock?password=s3cret", ["s3cret"], False),
    ("redis://:s3cret@127.0.0.1:99999/0", ["s3cret"], True),
    ("http://u:s3cret@example.invalid/", ["s3cret"], True),
]


@pytest.mark.parametrize(("url", "secrets", "refused"), SECRET_URLS)
def test_no_error_shows_a_password(url: str, secrets: list[str], refused: bool) -> None:
    url = url.format(port=free_port())
    invocations = [
        ["queues", "--redis", url],
        ["stats", "q", "--redis", url],
        ["offer", "q", "1", "-d", "1", "--redis", url],
        ["dead", "q", "--redis", url],
        ["prune", "--redis", url],
    ]
    if refused:  # an unreachable server is the exporter's and the worker's to wait out
        invocations += [
            ["exporter", "--port", "0", "--redis", url],
            ["worker", "tests.acceptance.test_cli_views:failing_handler", "-q", "q",
             "--redis", url],
            ["dashboard", "--port", "0", "--redis", url],
        ]  # fmt: skip
    env = cli_env()
    env["PYTHONPATH"] = str(ROOT)
    for result in run_many(invocations, env=env):
        result.failed_with(code=2 if refused else 1)
        for secret in secrets:
            assert secret not in result.err + result.out, (secret, result)


def test_a_password_in_the_environment_stays_out_of_the_command_line(
    redis7_server: EmbeddedRedis,
) -> None:
    # The documented alternative to --redis: REDIS_URL, read from the environment.
    url = f"redis://default:s3cret@127.0.0.1:{free_port()}/0"
    result = run_many([["queues"]], env=cli_env(REDIS_URL=url))[0]
    result.failed_with("127.0.0.1")
    assert "s3cret" not in result.err


# -- registry pruning ---------------------------------------------------------------------------


def test_prune_removes_queues_that_hold_nothing(
    queue: Callable[..., DelayQueue], target: list[str], raw: redis.Redis, prefix: str
) -> None:
    queue("alive").offer("x", 60)
    drained = queue("drained")
    drained.offer("y", 0)
    task = drained.poll(1)
    assert task is not None
    task.ack()  # no tasks left; its lifetime counters stay
    raw.sadd(f"{prefix}:queues", "ghost", "bad name!")  # no keys at all; not a valid name
    registry = f"{prefix}:queues"

    def members() -> set[str]:
        return {m.decode() for m in raw.smembers(registry)}

    everything = {"alive", "drained", "ghost", "bad name!"}
    assert members() == everything
    dry = piped("prune", "--dry-run", "--json", *target).json()
    assert dry == {"removed": ["bad name!", "ghost"], "kept": 2, "dry_run": True}
    assert members() == everything

    assert piped("prune", "--json", *target).json()["removed"] == ["bad name!", "ghost"]
    assert members() == {"alive", "drained"}
    listed = piped("queues", *target)
    assert listed.out.split() == ["alive", "drained"] and listed.err == "", listed

    emptied = piped("prune", "--empty", *target)
    assert emptied.code == 0 and "removed drained" in emptied.out, emptied
    assert members() == {"alive"}
    # Still known by its keys: its stats show, not an unknown-queue error.
    assert piped("stats", "drained", "--json", *target).json()[0]["counters"]["acked"] == 1


def test_prune_keeps_a_queue_whose_tasks_wait_in_the_layout_a_reshard_leaves(
    queue: Callable[..., DelayQueue], target: list[str], redis7_server: EmbeddedRedis, prefix: str
) -> None:
    """Mid-reshard, a queue's tasks may all be in its previous layout: prune (even --empty)
    keeps it, as it keeps a one-slot queue holding a task (before: it was removed from the
    registry, and so from stats, the exporter and the dashboard, with a task in it)."""
    queue("orders").offer("in the old layout", 3600)
    reshard("orders", redis7_server.url, shards=4, prefix=prefix)
    assert queue("orders").stats().delayed == 1
    for empty in ([], ["--empty"]):
        dry = piped("prune", *empty, "--dry-run", "--json", *target).json()
        assert dry["removed"] == [], (empty, dry)

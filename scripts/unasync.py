"""Generate sync code from asyncio code: ``python scripts/unasync.py [--check]``.

Each pair in ``PAIRS`` is an asyncio source and the sync file generated from it: every rule
in ``RULES`` is applied to the source in order, the imports are sorted and the result laid
out by ``ruff format``. Generated files start with a do-not-edit header naming their source;
edit the source and run this script again (``make unasync``).

The convention is an ``_async`` folder beside a ``_sync`` one with the same file names:
``src/delayq/_async`` (the queue), ``src/delayq/outbox/_async`` (the outbox) and
``tests/integration/_async`` (tests written once, with ``await``, that run on both front
ends). A module the two flavours cannot share (thread or asyncio primitives) is written by
hand on each side under the same name and imported relatively, as ``backend.py`` is.

``--check`` (run by ``make test``) fails when a generated file is missing or out of date,
when a file whose header says it was generated is no longer a target here (delete it, or
run the script, which deletes it), and when a rule matches nothing in any source: a dead
rule, whose code is gone; delete the rule.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (asyncio source, generated sync file), relative to the repository root.
PAIRS: list[tuple[str, str]] = [
    # the queue and its connection layer (backend.py is written by hand on each side)
    ("src/delayq/_async/queue.py", "src/delayq/_sync/queue.py"),
    ("src/delayq/_async/runner.py", "src/delayq/_sync/runner.py"),
    ("src/delayq/_async/shard.py", "src/delayq/_sync/shard.py"),
    ("src/delayq/_async/reshard.py", "src/delayq/_sync/reshard.py"),
    ("src/delayq/_async/consumer.py", "src/delayq/_sync/consumer.py"),
    ("src/delayq/_async/limits.py", "src/delayq/_sync/limits.py"),
    ("src/delayq/_async/connection.py", "src/delayq/_sync/connection.py"),
    ("src/delayq/_async/subscriber.py", "src/delayq/_sync/subscriber.py"),
    ("src/delayq/_async/sentinel.py", "src/delayq/_sync/sentinel.py"),
    ("src/delayq/_async/schedules.py", "src/delayq/_sync/schedules.py"),
    ("src/delayq/_async/schedule_moves.py", "src/delayq/_sync/schedule_moves.py"),
    # the outbox
    ("src/delayq/outbox/_async/outbox.py", "src/delayq/outbox/_sync/outbox.py"),
    # the way off Redisson
    ("src/delayq/redisson/_async/producer.py", "src/delayq/redisson/_sync/producer.py"),
    ("src/delayq/redisson/_async/migrate.py", "src/delayq/redisson/_sync/migrate.py"),
    # tests of both front ends (flavor.py is written by hand on each side)
    ("tests/integration/_async/test_smoke.py", "tests/integration/_sync/test_smoke.py"),
    (
        "tests/integration/_async/test_schedule_api.py",
        "tests/integration/_sync/test_schedule_api.py",
    ),
    ("tests/integration/_async/test_outbox.py", "tests/integration/_sync/test_outbox.py"),
    ("tests/integration/_async/test_faults.py", "tests/integration/_sync/test_faults.py"),
    ("tests/integration/_async/test_cluster.py", "tests/integration/_sync/test_cluster.py"),
    ("tests/integration/_async/test_listener.py", "tests/integration/_sync/test_listener.py"),
    (
        "tests/integration/_async/test_worker_start.py",
        "tests/integration/_sync/test_worker_start.py",
    ),
    (
        "tests/integration/_async/test_connection_layer.py",
        "tests/integration/_sync/test_connection_layer.py",
    ),
]

# (regular expression, replacement), applied in this order to every source.
RULES: list[tuple[str, str]] = [
    # the public names of the two front ends
    (r"\bAsyncDelayQueue\b", "DelayQueue"),
    (r"\bAsyncTask\b", "Task"),
    (r"\bAsyncShard\b", "Shard"),
    (r"\bAsyncConsumer\b", "Consumer"),
    (r"\bAsyncLimits\b", "Limits"),
    (r"\bAsyncWorker\b", "Worker"),
    (r"\bAsyncOutbox\b", "Outbox"),
    (r"\bAsync(RedissonDelayedQueue|Migration)\b", r"\1"),
    (r"\bAsyncSchedules\b", "Schedules"),
    (r"\baconnect\b", "connect"),
    # a front end outside the package imports the connection layer's own flavour
    (r"from \.\.\._async import", "from ..._sync import"),
    # the language
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\basynccontextmanager\b", "contextmanager"),
    (r"\bAsyncIterator\b", "Iterator"),
    # libraries: redis-py; psycopg, psycopg_pool and SQLAlchemy's classes; the outbox's
    # connection helpers (outbox/_conn.py)
    (r"\bredis\.asyncio\b", "redis"),
    (r"\baclose\(\)", "close()"),
    (r"\bAsync(Connection|Cursor|Session|ConnectionPool|Engine)\b", r"\1"),
    (r"\ba(admin|execute|check_target)\b", r"\1"),
    # tests: the fixtures of tests/conftest.py
    (r"\bmake_async_queue\b", "make_queue"),
    # words of docstrings
    (r"the asyncio front end", "the synchronous front end"),
    (r"Wait as long as it takes", "Block as long as it takes"),
]

HEADER = "# Generated from {source} by scripts/unasync.py: do not edit.\n"
GENERATED = re.compile(r"# Generated from \S+ by scripts/unasync\.py: do not edit\.$")
SEARCHED = ("src", "tests")  # where generated files no longer listed are looked for


def _ruff() -> str:
    """The ruff beside this Python (the project's venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("ruff")
    return str(beside) if beside.exists() else shutil.which("ruff") or "ruff"


def _ruff_stdin(args: list[str], source: str, path: Path) -> str:
    done = subprocess.run(
        [_ruff(), *args, "--stdin-filename", str(path), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return done.stdout


def formatted(source: str, path: Path) -> str:
    """The source with its imports sorted (renaming reorders them) as ``ruff format`` lays
    it out (removing ``await`` shortens lines)."""
    source = _ruff_stdin(["check", "--select", "I", "--fix", "--exit-zero", "-q"], source, path)
    return _ruff_stdin(["format"], source, path)


def header(source: Path, target: Path) -> str:
    """The header, naming the source from the folder that holds both (``_async/queue.py``)."""
    common = Path(os.path.commonpath([source, target]))
    return HEADER.format(source=source.relative_to(common).as_posix())


def generate(
    pairs: Sequence[tuple[str, str]], rules: Sequence[tuple[str, str]], root: Path = ROOT
) -> tuple[dict[Path, str], list[tuple[str, str]]]:
    """Each target's wanted text, and the rules that matched nothing in any source."""
    compiled = [(re.compile(pattern), replacement) for pattern, replacement in rules]
    hits = [0] * len(rules)
    wanted: dict[Path, str] = {}
    for source_name, target_name in pairs:
        source, target = root / source_name, root / target_name
        text = source.read_text()
        for i, (pattern, replacement) in enumerate(compiled):
            text, count = pattern.subn(replacement, text)
            hits[i] += count
        wanted[target] = formatted(header(source, target) + text, target)
    dead = [rule for rule, count in zip(rules, hits, strict=True) if count == 0]
    return wanted, dead


def orphans(targets: set[Path], root: Path = ROOT) -> list[Path]:
    """Files that say they were generated but are no longer a target."""
    found = []
    for folder in SEARCHED:
        for path in sorted((root / folder).rglob("*.py")):
            if path in targets:
                continue
            with path.open() as f:
                if GENERATED.match(f.readline().rstrip("\n")):
                    found.append(path)
    return found


def main(
    argv: Sequence[str],
    pairs: Sequence[tuple[str, str]] = PAIRS,
    rules: Sequence[tuple[str, str]] = RULES,
    root: Path = ROOT,
) -> int:
    check = "--check" in argv
    wanted, dead = generate(pairs, rules, root)
    problems = [f"dead rule (matches nothing in any source): {p} -> {r}" for p, r in dead]
    for target, text in wanted.items():
        if target.exists() and target.read_text() == text:
            continue
        if check:
            problems.append(f"out of date: {target.relative_to(root)}")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target.relative_to(root)}")
    for path in orphans(set(wanted), root):
        if check:
            problems.append(f"generated but no longer listed in PAIRS: {path.relative_to(root)}")
        else:
            path.unlink()
            print(f"removed {path.relative_to(root)} (its source is no longer listed)")
    if problems:
        print("scripts/unasync.py:", *problems, sep="\n  ", file=sys.stderr)
        if dead:
            print("delete each dead rule from RULES (its code is gone)", file=sys.stderr)
        if check and len(problems) > len(dead):
            print("run python scripts/unasync.py to regenerate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Generate the sync front end from the asyncio one: ``python scripts/unasync.py [--check]``.

The sync code is never edited by hand, so the two front ends cannot drift apart. ``--check``
fails when the generated file is out of date (run in CI).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "delayq"
FILES = ["queue.py", "runner.py", "sharded.py", "consumer.py"]
HEADER = "# Generated from _async/{name} by scripts/unasync.py: do not edit.\n"

SUBS = [
    (r"\bAsyncDelayQueue\b", "DelayQueue"),
    (r"\bAsyncShardedQueue\b", "ShardedQueue"),
    (r"\bAsyncTask\b", "Task"),
    (r"\bAsyncWorker\b", "Worker"),
    (r"\bAsyncConsumer\b", "Consumer"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bredis\.asyncio\b", "redis"),
    (r"the asyncio front end", "the synchronous front end"),
    (r"Wait as long as it takes", "Block as long as it takes"),
]


def convert(source: str) -> str:
    for pattern, replacement in SUBS:
        source = re.sub(pattern, replacement, source)
    return source


def formatted(source: str, path: Path) -> str:
    """The source as ``ruff format`` lays it out (removing `await` shortens lines)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    done = subprocess.run(
        [ruff, "format", "--stdin-filename", str(path), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in FILES:
        target = ROOT / "_sync" / name
        source = HEADER.format(name=name) + convert((ROOT / "_async" / name).read_text())
        wanted = formatted(source, target)
        if target.exists() and target.read_text() == wanted:
            continue
        if check:
            stale.append(str(target))
        else:
            target.write_text(wanted)
            print(f"wrote {target}")
    if stale:
        print("out of date, run python scripts/unasync.py:", *stale, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

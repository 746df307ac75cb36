"""``python -m bench.peers._launch URL QUEUE SINK 0|1 -- ARGV...``: set the BENCH_* variables
and exec ARGV (see :func:`bench.peers.base.with_bench_env`)."""

from __future__ import annotations

import os
import sys

from .base import bench_env


def main(args: list[str]) -> None:
    if len(args) < 6 or args[4] != "--":
        raise SystemExit("usage: python -m bench.peers._launch URL QUEUE SINK 0|1 -- ARGV...")
    url, queue, sink, hold, _, *argv = args
    os.environ.update(bench_env(url, queue, sink, hold == "1"))
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])

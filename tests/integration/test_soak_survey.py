"""The soak's final survey (issue #21) reads every task's state through a topology that may
still be settling: before, one Redis error there (a cluster node a failed fault had left
stopped) crashed the run after two hours, and no figure came out."""

from __future__ import annotations

import threading
import time

from bench.soak.run import Harness

from delayq import DelayQueue
from tests.topology import Node


def test_the_survey_waits_for_a_stopped_server_and_says_what_it_could_not_read(
    prefix: str,
) -> None:
    node = Node(aof=True).start()
    try:
        queue = DelayQueue("survey", node.url, prefix=prefix, create=True)
        try:
            task_id = queue.offer("x", 600)
            node.kill()
            started = time.monotonic()
            assert Harness._state_of(queue, task_id, time.monotonic() + 1.0) == "unreadable"
            assert time.monotonic() - started >= 1.0  # it kept trying until its patience ran out
            restart = threading.Timer(1.0, node.start)
            restart.start()
            try:  # the server comes back (its AOF replayed) within the survey's patience
                assert Harness._state_of(queue, task_id, time.monotonic() + 30) == "delayed"
            finally:
                restart.join()
        finally:
            queue.close()
    finally:
        node.stop()

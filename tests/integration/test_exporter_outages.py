"""The exporter logs a Redis outage once, not once per scrape (issue #13): a warning at the
first failed scrape, an info line when Redis answers again; never the password. The
connection layer under it sees the same outage: the process logs it once (issue #22), with
no logger filter to mute it."""

from __future__ import annotations

import logging

import pytest

from delayq import DelayQueue
from delayq.embedded import EmbeddedRedis

pytest.importorskip("prometheus_client")

from delayq.metrics import QueueCollector


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """Every delayq line about Redis: the exporter's and the connection layer's."""
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name.startswith("delayq") and "Redis" in r.getMessage()
    ]


def test_an_outage_is_logged_once_and_its_end_once(
    caplog: pytest.LogCaptureFixture, prefix: str
) -> None:
    caplog.set_level(logging.INFO, logger="delayq")
    # A user with a password (the default user stays open for the fixture's readiness PING).
    acl = ["--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"]
    with EmbeddedRedis(extra_args=acl) as server:
        url = f"redis://alice:s3cret@127.0.0.1:{server.port}/0"
        q = DelayQueue("watched", url, prefix=prefix)
        q.offer("x", 60)
        q.close()
        collector = QueueCollector(url, prefix=prefix, reconnect_timeout=0.3)
        try:
            assert collector.snapshot()[1] is True
            assert outage_lines(caplog) == []

            server.kill()
            assert [collector.snapshot()[1] for _ in range(4)] == [False] * 4
            # The first failed scrape: one warning for the process (the connection layer's
            # calls and the exporter's scrapes are one outage); the three after it: nothing
            # (no filter muted them: nothing was logged).
            lines = outage_lines(caplog)
            assert len(lines) == 1, lines
            assert lines[0][0] == logging.WARNING and "unavailable" in lines[0][1]
            assert f"127.0.0.1:{server.port}" in lines[0][1]

            server.start()
            assert collector.snapshot()[1] is True  # (a fresh server: no queues any more)
            assert collector.snapshot()[1] is True
            lines = outage_lines(caplog)
            assert len(lines) == 2, lines  # its end, once
            assert lines[1][0] == logging.INFO and "available again after" in lines[1][1]

            server.kill()  # a second outage is a new one: logged again, once
            assert [collector.snapshot()[1] for _ in range(3)] == [False] * 3
            assert len(outage_lines(caplog)) == 3
        finally:
            collector.close()
    assert "s3cret" not in caplog.text

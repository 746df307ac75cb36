"""The soak's checker catches planted bugs (issue #21): the same harness and workload as
``make soak``, on clients whose Lua scripts this test patches at run time (a
``sitecustomize`` module on their PYTHONPATH; the product's files are untouched):

- the ack skips the lease check: a consumer whose lease ran out (its handler outran the
  visibility timeout) still acks after the task went to another consumer: a double lease;
- the fetch decides what is due by the client's clock (5 s ahead): deliveries early by the
  server's clock, which the harness samples on its own.

The unpatched build passing the same checker is tests/acceptance/test_soak_smoke.py.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from bench.soak.run import Config, Harness

pytestmark = pytest.mark.timeout(240)

ACK_WITHOUT_LEASE_CHECK = """
    import delayq._core.scripts as scripts

    _read = scripts._read
    HELD = (
        "if leases[k] == tokens[k] and expiries[k] and ms_of(expiries[k]) >= now"
        " and not seen[id] then"
    )

    def read(name):
        text = _read(name)
        if name == "_lib":
            assert HELD in text, "the lease check moved: update this planted bug"
            text = text.replace(HELD, "if not seen[id] then")
        return text

    scripts._read = read
"""

FETCH_ON_CLIENT_CLOCK = """
    import time

    import delayq._core.protocol as protocol
    import delayq._core.scripts as scripts

    AHEAD_S = 5.0
    _fetch_args, _read = protocol.fetch_args, scripts._read

    def fetch_args(*args, **kwargs):
        # The client's clock rides in the nonce (ARGV[3]) as "<ms>x<nonce>".
        out = _fetch_args(*args, **kwargs)
        out[2] = f"{int((time.time() + AHEAD_S) * 1000)}x{out[2]}"
        return out

    SERVER_CLOCK = "local clock = redis.call('TIME')"
    CLIENT_CLOCK = (
        "local cms = tonumber(string.match(ARGV[3], '^(%d+)x'))\\n"
        "local clock = {math.floor(cms / 1000), (cms % 1000) * 1000}"
    )

    def read(name):
        text = _read(name)
        if name == "fetch":
            assert SERVER_CLOCK in text, "fetch.lua's clock moved: update this planted bug"
            text = text.replace(SERVER_CLOCK, CLIENT_CLOCK)
        return text

    protocol.fetch_args = fetch_args
    scripts._read = read
"""


def _run_with(tmp_path: Path, patch: str, **config: object) -> object:
    patches = tmp_path / "patch"
    patches.mkdir()
    (patches / "sitecustomize.py").write_text(textwrap.dedent(patch))
    path = os.pathsep.join(p for p in (str(patches), os.environ.get("PYTHONPATH", "")) if p)
    settings: dict = {
        "duration_s": 20.0, "rate": 15.0, "consumers": ("take", "take", "take"),
        "outbox_dsn": None, "drain_s": 40.0, "out": str(tmp_path / "soak"),
        "extra_env": {"PYTHONPATH": path}, "late_bound_ms": 2000.0,
    }  # fmt: skip
    settings.update(config)
    return Harness(Config(**settings)).run()  # type: ignore[arg-type]


def test_the_checker_finds_double_leases_when_the_ack_skips_the_lease_check(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # One task in twenty is held past its 1 s lease by a take/ack loop, then acked.
    report = _run_with(
        tmp_path, ACK_WITHOUT_LEASE_CHECK, visibility_timeout_s=1.0, slow_fraction=0.05
    )
    doubles = report.unexplained("double-lease")  # type: ignore[attr-defined]
    assert doubles, f"no double lease found: {report.anomalies[:5]}"  # type: ignore[attr-defined]
    assert "succeeded although attempt" in doubles[0].detail


def test_the_checker_finds_early_deliveries_when_the_fetch_uses_the_clients_clock(tmp_path) -> None:  # type: ignore[no-untyped-def]
    report = _run_with(tmp_path, FETCH_ON_CLIENT_CLOCK, slow_fraction=0.0)
    early = report.unexplained("early")  # type: ignore[attr-defined]
    assert len(early) > 10, f"too few early deliveries found: {report.anomalies[:5]}"  # type: ignore[attr-defined]
    assert "before its due time by the server's clock" in early[0].detail

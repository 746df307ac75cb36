"""The soak's nemesis schedule (bench/soak/nemesis.py): which fault may start next."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from bench.soak.nemesis import FAULTS, FIT, RESHAPING, Nemesis, NoTarget
from bench.soak.run import Config


def nemesis(topology: str, seed: int = 5) -> Nemesis:
    config = Config(topology=topology, faults=FAULTS, seed=seed)
    return Nemesis(SimpleNamespace(config=config, pg_dsn="postgresql://x"))  # type: ignore[arg-type]


def test_faults_that_move_masters_or_slots_never_overlap_each_other() -> None:
    """With a failover running, a slot migration or a master stop waits: two of them at once
    left the 2-hour cluster run with a half-moved slot and masters without replicas."""
    for seed in range(20):
        n = nemesis("cluster", seed)
        n._active.add("failover")
        picks = {n._next_fault() for _ in range(40)}
        n._active.discard("failover")
        assert not picks & RESHAPING, picks
        assert picks - {None}, "other kinds still overlap a failover"


def test_every_kind_comes_once_before_any_comes_twice() -> None:
    n = nemesis("cluster")
    first = []
    for _ in range(len(n.faults)):
        fault = n._next_fault()
        assert fault is not None
        first.append(fault)
    assert sorted(first) == sorted(FIT["cluster"] & set(FAULTS))
    assert {"failover", "master-stop", "migrate"} <= set(first)  # one at a time, each comes


def test_the_survey_stops_asking_after_a_run_of_unreadable_tasks() -> None:
    """A shard no master serves costs each read a reconnect timeout: after GIVE_UP_AFTER
    unreadable tasks in a row the rest are marked unreadable (stuck, never settled)."""
    import time

    from bench.soak.run import GIVE_UP_AFTER, survey_states

    from delayq.exceptions import RedisUnavailable

    class Broken:
        calls = 0

        def get(self, task_id: str) -> None:
            self.calls += 1
            raise RedisUnavailable("CLUSTERDOWN")

    queue = Broken()
    ids = [f"t{i}" for i in range(1000)]
    states = survey_states(queue, ids, patience=time.monotonic() - 1)
    assert set(states.values()) == {"unreadable"} and len(states) == 1000
    assert queue.calls == GIVE_UP_AFTER


def test_a_fault_that_raises_mid_way_ends_its_window() -> None:
    """Before: the window's start was recorded, the injection raised, and no stop came: the
    window ran to the end of the 2-hour cluster run and excused everything after it."""
    recorded: list[tuple[str, dict[str, object]]] = []
    rec = SimpleNamespace(info=lambda f, **v: recorded.append((f, v)))
    config = Config(topology="cluster", faults=FAULTS, seed=1)
    n = Nemesis(SimpleNamespace(config=config, pg_dsn="postgresql://x", rec=rec))  # type: ignore[arg-type]

    def broken(fault: str, length: float, draw: float) -> None:
        n._window(fault, "redis")
        raise TimeoutError("the node was paused")

    n._maxmemory = broken  # type: ignore[method-assign]
    n._run("maxmemory", 1.0, 0.5)
    phases = [(f, v.get("phase")) for f, v in recorded]
    assert phases == [("fault", "start"), ("nemesis-error", None), ("fault", "stop")]
    assert n._open == {}


Recorded = list[tuple[str, dict[str, object]]]


def _nemesis(topology: str, **harness: object) -> tuple[Nemesis, Recorded]:
    recorded: Recorded = []
    rec = SimpleNamespace(info=lambda f, **v: recorded.append((f, v)))
    config = Config(topology=topology, faults=FAULTS, seed=1)
    fake = SimpleNamespace(config=config, pg_dsn="postgresql://x", rec=rec, **harness)
    return Nemesis(fake), recorded  # type: ignore[arg-type]


def test_a_node_fault_skips_a_master_another_fault_holds() -> None:
    """Before: a maxmemory drawn while a CLIENT PAUSE held the only master timed out on it
    (a window from its start to the error, and no fault injected)."""
    master = SimpleNamespace(port=7000, client=lambda **_: SimpleNamespace(close=lambda: None))
    n, recorded = _nemesis("sentinel", group=SimpleNamespace(master=lambda: master))
    with n._holding(7000, "redis-pause"):
        n._run("maxmemory", 1.0, 0.5)
    reason = "the master (7000) is held by redis-pause"
    assert recorded == [("nemesis-skip", {"fault": "maxmemory", "reason": reason})]
    assert n._held == {} and n._open == {}


def test_a_cluster_fault_aims_at_a_shard_whose_master_is_up_and_free() -> None:
    """Before: the drawn shard's master was taken as it was, down or not ("no master owns
    slot 2048": 9 faults of the 2-hour cluster run not injected)."""
    nodes = {1: SimpleNamespace(port=7001), 2: SimpleNamespace(port=7002)}

    def master_of(slot: int) -> object:
        if slot not in nodes:
            raise LookupError(f"no master owns slot {slot}")
        return nodes[slot]

    n, _ = _nemesis("cluster", group=SimpleNamespace(master_of=master_of),
                    shard_slots=lambda: [0, 1, 2])  # fmt: skip
    assert n._shard_master(0.0) == (nodes[1], 1)  # slot 0's master is down: the next one
    with n._holding(7001, "master-stop"):
        assert n._shard_master(0.0) == (nodes[2], 2)
        with n._holding(7002, "redis-pause"), pytest.raises(NoTarget):
            n._shard_master(0.5)
    assert n._shard_master(0.9) == (nodes[2], 2)
    with n._holding(7002, "maxmemory"):  # from the drawn shard on, wrapping round
        assert n._shard_master(0.9) == (nodes[1], 1)

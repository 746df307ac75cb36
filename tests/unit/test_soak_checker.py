"""The soak's checker (bench/soak/checker.py) on hand-written histories: each property finds
its counterexample, and a clean history passes."""

from __future__ import annotations

from typing import Any

import pytest
from bench.soak.checker import check, summary
from bench.soak.history import Event, Recorder, load


class H:
    """A history under construction; ``t`` in seconds, the server clock = 1e6 s + t."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.n = 0

    def op(self, p: str, f: str, t0: float, t1: float, kind: str = "ok", inv: Any = None,
           **out: Any) -> None:  # fmt: skip
        self.n += 1
        self.events.append(Event(p, "invoke", f, t0, self.n, inv or {}))
        self.events.append(Event(p, kind, f, t1, self.n, out))

    def info(self, p: str, f: str, t: float, **v: Any) -> None:
        self.events.append(Event(p, "info", f, t, 0, v))

    def clock(self, until: float, step_at: float | None = None, step_ms: int = 0,
              step_back_at: float | None = None) -> None:  # fmt: skip
        t = 0.0
        while t <= until:
            stepped = step_at is not None and t >= step_at
            stepped = stepped and (step_back_at is None or t < step_back_at)
            ms = (1_000_000 + t) * 1000 + (step_ms if stepped else 0)
            self.info("harness", "clock", t, server_ms=ms, rtt=0.0002)
            t += 0.1

    def offer(self, p: str, task: str, t: float, delay: float, **inv: Any) -> int:
        self.op(p, "offer", t, t + 0.001, inv={"id": task, **inv}, id=task, outcome="created")
        return int((1_000_000 + t + delay) * 1000)

    def deliver(self, p: str, task: str, t: float, due_ms: int, attempts: int = 1,
                server_ms: int | None = None, token: str | None = None) -> str:  # fmt: skip
        token = token or f"{p}-{task}-{attempts}"
        delivered = server_ms if server_ms is not None else int((1_000_000 + t) * 1000)
        self.op(p, "fetch", t - 0.002, t, id=task, due_ms=due_ms, delivered_ms=delivered,
                attempts=attempts, token=token)  # fmt: skip
        return token

    def handled(self, p: str, task: str, t: float, token: str, **v: Any) -> None:
        self.info(p, "handled", t, id=task, token=token, **v)

    def ack(self, p: str, task: str, t: float, token: str, kind: str = "ok") -> None:
        self.op(p, "ack", t, t + 0.001, kind, inv={"id": task, "token": token})

    def final(self, t: float, **states: str) -> None:
        self.info("harness", "final", t, states=states)

    def fault(self, name: str, target: str, t0: float, t1: float) -> None:
        self.info("nemesis", "fault", t0, id=f"{name}@{t0}", fault=name, target=target,
                  phase="start")  # fmt: skip
        self.info("nemesis", "fault", t1, id=f"{name}@{t0}", fault=name, target=target,
                  phase="stop")  # fmt: skip

    def check(self, **kw: Any) -> Any:
        return check(sorted(self.events, key=lambda e: e.t), **kw)


def processed(h: H, p: str, task: str, t: float, due: int, attempts: int = 1) -> str:
    token = h.deliver(p, task, t, due, attempts)
    h.handled(p, task, t + 0.01, token)
    h.ack(p, task, t + 0.02, token)
    return token


def test_a_clean_history_passes_and_counts_its_figures() -> None:
    h = H()
    h.clock(10)
    for k in range(5):
        due = h.offer("producer", f"t{k}", 1 + k * 0.1, 1.0)
        processed(h, "take-1", f"t{k}", 2.003 + k * 0.1, due)
    h.final(9.9)
    report = h.check()
    assert report.valid, report.anomalies
    s = summary(report)
    assert (s["offers_ok"], s["deliveries"], s["lost"], s["early"]) == (5, 5, 0, 0)
    assert report.p99_outside_ms is not None and report.p99_outside_ms < 10


def test_an_acknowledged_offer_never_delivered_and_gone_is_lost() -> None:
    h = H()
    h.clock(10)
    h.offer("producer", "a", 1, 1.0, durable=True)
    h.final(9.9)
    report = h.check()
    [lost] = report.unexplained("lost")
    assert lost.task == "a" and "durable" in lost.detail


def test_a_non_durable_loss_after_a_redis_kill_is_explained_but_counted() -> None:
    h = H()
    h.clock(10)
    h.offer("producer", "a", 1, 5.0)
    h.fault("redis-kill", "redis", 1.2, 2)
    h.final(9.9)
    report = h.check()
    assert report.valid
    assert report.count("lost") == 1 and "redis-kill" in (report.anomalies[0].explained or "")


def test_a_full_redis_explains_no_loss() -> None:
    """Before: a committed outbox row the relay buried in a ``maxmemory`` window (writes
    refused, none dropped) counted as explained by that window."""
    h = H()
    h.clock(10)
    h.op("outbox-producer", "outbox", 1, 1.01, ids=["c1"], commit=True)
    h.offer("producer", "a", 1, 5.0)
    h.fault("maxmemory", "redis", 1.2, 2)
    h.final(9.9)
    report = h.check()
    assert not report.valid
    assert sorted(a.kind for a in report.unexplained()) == ["lost", "outbox"]


def test_a_history_with_no_load_proves_nothing() -> None:
    h = H()
    h.clock(10)
    h.final(9.9)
    assert [a.kind for a in h.check(min_offers=1).unexplained()] == ["idle"]


def test_a_task_still_waiting_after_the_drain_is_stuck() -> None:
    h = H()
    h.clock(10)
    h.offer("producer", "a", 1, 1.0)
    h.final(9.9, a="delayed")
    assert [a.kind for a in h.check().unexplained()] == ["stuck"]


def test_a_delivery_early_by_the_servers_clock_is_found_though_the_script_said_otherwise() -> None:
    # The script trusted a client clock 300 s ahead: its own delivered_ms looks on time, but
    # the server's clock, sampled by the harness, read 4 s before the due time.
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 5.0)
    h.deliver("take-1", "a", 2.0, due, server_ms=(1_000_000 + 302) * 1000)
    [early] = h.check().unexplained("early")
    assert early.task == "a" and "at least 3997 ms before" in early.detail


def test_a_server_clock_step_forward_is_not_an_early_delivery() -> None:
    # faketime steps Redis's clock 60 s ahead at t=3: a task due at 1e6+6 s delivered at
    # t=3.05 is on time by the server's clock (which is what delayq promises).
    h = H()
    h.clock(10, step_at=3.0, step_ms=60_000)
    due = h.offer("producer", "a", 1, 5.0)
    h.deliver("take-1", "a", 3.05, due, server_ms=int((1_000_000 + 63.05) * 1000))
    assert not h.check().unexplained("early")


@pytest.mark.parametrize("stepped", [True, False])
def test_a_worker_task_fetched_before_the_servers_clock_stepped_back_is_judged_by_that_clock(
    stepped: bool,
) -> None:
    """Before: the 2-hour soak's one early delivery. Redis's clock ran 20 s ahead from t=3 to
    t=6; a worker fetched a task due at 1e6+16 s at t=5.9 (the server read 1e6+25.9) into its
    buffer, and its handler began at t=7, when the server read 1e6+7: by the clock that
    fetched it the task was due. Without the step the same delivery is early."""
    h = H()
    h.clock(10, step_at=3.0 if stepped else None, step_ms=20_000, step_back_at=6.0)
    due = h.offer("producer", "a", 1, 15.0)
    fetched_ms = int((1_000_000 + 5.9 + 20) * 1000)  # what the fetch says: checked, not trusted
    h.info("worker-1", "deliver", 7.0, id="a", due_ms=due, delivered_ms=fetched_ms,
           attempts=1, token="w-a-1")  # fmt: skip
    early = h.check().unexplained("early")
    assert [a.task for a in early] == ([] if stepped else ["a"])


def test_an_ack_that_succeeded_after_the_task_went_to_another_consumer_is_a_double_lease() -> None:
    h = H()
    h.clock(20)
    due = h.offer("producer", "a", 1, 1.0)
    first = h.deliver("take-1", "a", 2.0, due)
    second = h.deliver("take-2", "a", 6.0, due, attempts=2)
    h.handled("take-1", "a", 7.0, first, slow=True)
    h.ack("take-1", "a", 7.01, first)  # the ack skipped the lease check
    h.handled("take-2", "a", 6.1, second)
    h.ack("take-2", "a", 6.2, second)
    h.final(19)
    report = h.check()
    [double] = report.unexplained("double-lease")
    assert "take-1's ack of attempt 1 succeeded" in double.detail
    # The same history with the ack refused (LeaseLost) is what a correct build gives.
    h.events = [e for e in h.events if not (e.f == "ack" and e.process == "take-1")]
    h.ack("take-1", "a", 7.01, first, kind="fail")
    report = h.check()
    assert report.valid and report.count("duplicate", explained=True) == 1


def test_one_attempt_number_handed_out_twice_is_a_double_lease() -> None:
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 1.0)
    h.deliver("take-1", "a", 2.0, due, token="x-1")
    h.deliver("take-2", "a", 2.5, due, token="y-1")
    h.final(9, a="inflight")
    assert sorted(a.kind for a in h.check().unexplained()) == ["double-lease", "stuck"]


def test_a_delivery_after_a_successful_cancel_is_found() -> None:
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 3.0)
    h.op("producer", "cancel", 1.5, 1.501, inv={"id": "a"}, cancelled=True)
    h.deliver("take-1", "a", 4.0, due)
    h.final(9)
    assert [a.kind for a in h.check().unexplained()] == ["after-cancel"]


def test_a_failover_explains_a_delivery_after_a_non_durable_cancel_only() -> None:
    """A cancel only the old master had dies in the failover after it (as a non-durable
    offer may): explained, and counted. A durable cancel has no such excuse: only a failover
    during the call itself explains the task coming back."""
    h = H()
    h.clock(20)
    for task, durable in (("plain", False), ("durable", True)):
        due = h.offer("producer", task, 1, 3.0)
        h.op("producer", "cancel", 1.5, 1.501, inv={"id": task, "durable": durable},
             cancelled=True)  # fmt: skip
        h.deliver("take-1", task, 6.0, due, attempts=2)
    h.fault("failover-observed", "redis", 2.0, 5.0)
    h.final(19)
    report = h.check()
    assert report.count("after-cancel") == 2
    [unexplained] = report.unexplained()
    assert unexplained.task == "durable" and "durable cancel" in unexplained.detail
    h = H()
    h.clock(20)
    due = h.offer("producer", "durable", 1, 3.0)
    h.op("producer", "cancel", 1.5, 2.5, inv={"id": "durable", "durable": True}, cancelled=True)
    h.deliver("take-1", "durable", 6.0, due, attempts=2)
    h.fault("failover-observed", "redis", 2.0, 5.0)  # during the cancel's WAIT
    h.final(19)
    [explained] = h.check().anomalies
    assert explained.explained == "failover-observed during the cancel (durable)"


def test_a_cancelled_task_is_not_lost() -> None:
    h = H()
    h.clock(10)
    h.offer("producer", "a", 1, 3.0)
    h.op("producer", "cancel", 1.5, 1.501, inv={"id": "a"}, cancelled=True)
    h.final(9)
    assert h.check().valid


def test_a_task_gone_after_a_cancel_of_unknown_outcome_is_not_lost() -> None:
    """A durable cancel that raised NotDurable was taken by the master and may hold (the 2-hour
    Sentinel soak of 2026-12-06 counted 4 such tasks as lost durable offers); so may one still
    running when the history ends. A cancel that returned False proves nothing was cancelled."""
    h = H()
    h.clock(10)
    h.offer("producer", "raised", 1, 3.0, durable=True)
    h.op("producer", "cancel", 1.5, 3.5, "unknown", inv={"id": "raised", "durable": True},
         error="NotDurable: 1 task(s) cancelled but not confirmed within 2 s")  # fmt: skip
    h.offer("producer", "running", 1, 3.0, durable=True)
    h.events.append(Event("producer", "invoke", "cancel", 1.6, 999, {"id": "running"}))
    h.offer("producer", "refused", 1, 3.0, durable=True)
    h.op("producer", "cancel", 1.7, 1.701, inv={"id": "refused", "durable": True},
         cancelled=False)  # fmt: skip
    h.final(9.9)
    report = h.check()
    [lost] = report.unexplained("lost")
    assert lost.task == "refused"
    assert report.counts["cancels_unknown"] == 2
    assert report.counts["gone_after_unknown_cancel"] == 2


def test_two_live_tasks_of_one_dedup_key_are_found() -> None:
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 1.0, key="order-1")
    h.offer("producer", "b", 1.5, 1.0, key="order-1")  # created while a is live
    processed(h, "take-1", "a", 2.01, due)
    h.final(9, b="delayed")
    kinds = [a.kind for a in h.check().unexplained()]
    assert "dedup" in kinds


def test_a_key_reused_after_its_task_finished_is_fine() -> None:
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 1.0, key="order-1")
    processed(h, "take-1", "a", 2.01, due)
    due_b = h.offer("producer", "b", 3, 1.0, key="order-1")
    processed(h, "take-1", "b", 4.01, due_b)
    h.final(9)
    assert h.check().valid


def test_a_redelivery_after_a_good_ack_outside_any_fault_is_an_unexplained_duplicate() -> None:
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 1.0)
    processed(h, "take-1", "a", 2.01, due)
    processed(h, "take-2", "a", 3.0, due, attempts=2)
    h.final(9)
    [dup] = h.check().unexplained()
    assert dup.kind == "duplicate"
    # During a Redis kill (the ack lost with the last second of AOF) it is explained.
    h.fault("redis-kill", "redis", 2.5, 2.8)
    report = h.check()
    assert report.valid and report.count("duplicate", explained=True) == 1


def test_an_older_attempt_handled_after_its_consumer_was_stopped_is_explained() -> None:
    """Before: in the 2-hour Sentinel run, take-0 was SIGSTOPped with its fetch's reply in
    flight; its lease lapsed, a worker took and handled attempt 2, and take-0, resumed,
    handled its attempt 1: an unexplained duplicate, though take-0's own stop explains it."""
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 0.5)
    h.op("take-0", "fetch", 1.6, 5.0, id="a", due_ms=due, delivered_ms=due, attempts=1,
         token="old")  # fmt: skip
    late = processed(h, "worker-3", "a", 4.6, due, attempts=2)
    assert late
    h.handled("take-0", "a", 5.01, "old")
    h.ack("take-0", "a", 5.02, "old", kind="fail")
    h.final(9)
    [dup] = h.check().unexplained()  # without the stop, nothing explains it
    assert dup.kind == "duplicate" and "attempt 1" in dup.detail
    h.fault("consumer-stop", "take-0", 1.7, 5.0)
    report = h.check()
    assert report.valid and report.count("duplicate", explained=True) == 1


def test_a_worker_killed_before_its_ack_explains_the_redelivery() -> None:
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 1.0)
    first = h.deliver("worker-1", "a", 2.01, due)
    h.handled("worker-1", "a", 2.02, first)  # a worker's ack is not in the history
    h.fault("consumer-kill", "worker-1", 2.03, 2.1)
    processed(h, "take-1", "a", 6.0, due, attempts=2)
    h.final(9)
    report = h.check()
    assert report.valid and report.count("duplicate", explained=True) == 1


def test_an_outbox_task_created_again_after_its_ack_by_a_killed_relay_is_explained() -> None:
    # The relay died after Redis applied its batch and before its DELETE committed: the
    # restarted relay offers the row again, and the task, acked meanwhile, lives again from
    # attempt 1. Not a double lease (the first life had ended); a duplicate the kill explains.
    h = H()
    h.clock(20)
    h.op("outbox-producer", "outbox", 1, 1.01, ids=["a"], commit=True)
    processed(h, "take-1", "a", 2.0, 1_000_002 * 1000)
    h.fault("relay-kill", "relay-0", 1.5, 2.5)
    processed(h, "take-2", "a", 3.0, 1_000_003 * 1000)
    h.final(19)
    report = h.check()
    assert report.valid, report.anomalies
    [dup] = report.anomalies
    assert dup.kind == "duplicate" and "outbox resend" in (dup.explained or "")


def test_a_retried_offer_that_lands_after_its_task_ran_starts_a_new_life() -> None:
    # Found by the 2-hour standalone run: an offer sent into a dead link is retried with its
    # id; the first send, held by TCP, lands when the link is back, runs and is acked by a
    # consume() loop (which records no ack), and the retry then makes the task again, due by
    # its own clock. Not a double lease: the first life had ended; a duplicate the
    # partition explains.
    h = H()
    h.clock(20)
    h.fault("partition", "redis", 1.0, 3.0)
    first = h.deliver("consume-1", "a", 3.10, 1_000_003_050)
    h.handled("consume-1", "a", 3.11, first)
    again = h.deliver("take-1", "a", 3.40, 1_000_003_350)  # made again: another due time
    h.handled("take-1", "a", 3.41, again)
    h.ack("take-1", "a", 3.42, again)
    h.final(19)
    report = h.check()
    assert report.count("double-lease") == 0, report.anomalies
    assert report.valid and report.count("duplicate", explained=True) == 1


def test_one_attempt_handed_out_twice_with_one_due_time_is_a_double_lease() -> None:
    # The same life's attempt handed to a second consumer after the first one's handler
    # completed (its ack not landed): the same due time, so no new life.
    h = H()
    h.clock(10)
    due = h.offer("producer", "a", 1, 1.0)
    first = h.deliver("consume-1", "a", 2.01, due)
    h.handled("consume-1", "a", 2.02, first)
    h.deliver("take-1", "a", 2.5, due)
    h.final(9)
    assert h.check().count("double-lease", explained=False) == 1


def test_the_outbox_must_deliver_exactly_the_committed_set() -> None:
    h = H()
    h.clock(10)
    h.op("outbox-producer", "outbox", 1, 1.01, ids=["c1"], commit=True)
    h.op("outbox-producer", "outbox", 1, 1.01, ids=["r1"], commit=False)
    h.deliver("take-1", "r1", 2.0, 1_000_002 * 1000)
    h.final(9)
    kinds = sorted(a.kind for a in h.check().unexplained())
    assert kinds == ["outbox", "outbox"]  # c1 never came, r1 should never have


def test_lateness_outside_fault_windows_has_a_bound_and_windows_are_excused() -> None:
    h = H()
    h.clock(20)
    for k in range(20):
        due = h.offer("producer", f"t{k}", 1 + k * 0.5, 0.5)
        late = 4.0 if 5 <= 1.5 + k * 0.5 <= 8 else 0.002
        processed(h, "take-1", f"t{k}", 1.5 + k * 0.5 + late, due)
    h.final(19.9)
    report = h.check(late_bound_ms=100, grace_s=0.5)
    [late] = report.unexplained()
    assert late.kind == "late" and late.detail.endswith("(before any fault)"), late.detail
    assert late.detail.count("4000 ms at t=") == 3  # the three latest, where to look
    h.fault("redis-stop", "redis", 1, 2)  # one that ended before them, excusing none
    late = h.check(late_bound_ms=100, grace_s=0.5).unexplained()[0]
    assert "4000 ms at t=9.0 (6.5 s after redis-stop's window)" in late.detail, late.detail
    h.fault("redis-pause", "redis", 5, 8)
    report = h.check(late_bound_ms=100, grace_s=5)
    assert report.valid, report.anomalies
    assert report.p99_inside_ms is not None and report.p99_inside_ms > 3000
    [recovered] = [r for w, r in report.recoveries if w.fault == "redis-pause"]
    assert 3 < recovered < 5  # the last 4 s-late one came at 12


def test_the_recorder_writes_lines_the_loader_reads_and_a_cut_line_is_skipped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rec = Recorder(tmp_path, "p1")
    with rec.operation("cancel", id="a") as out:
        out["cancelled"] = True
    rec.info("fault", id="x", fault="redis-kill", phase="start")
    rec.close()
    with open(tmp_path / "p1.jsonl", "a") as f:
        f.write('{"p": "p1", "type": "ok", "f"')  # a SIGKILL mid-line
    events = load(tmp_path)
    assert [(e.type, e.f) for e in events] == [("invoke", "cancel"), ("ok", "cancel"),
                                              ("info", "fault")]  # fmt: skip
    assert events[1].value == {"cancelled": True} and events[0].i == events[1].i


def test_the_report_gives_a_row_per_fault_alone_combined_and_none_and_a_plot(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import xml.etree.ElementTree as ET

    from bench.soak.report import Run, markdown, svg, totals

    h = H()
    h.clock(30)
    for k in range(40):
        due = h.offer("producer", f"t{k}", 1 + k * 0.5, 0.5)
        processed(h, "take-1", f"t{k}", 1.5 + k * 0.5 + 0.003, due)
    h.fault("redis-pause", "redis", 5, 7)
    h.fault("consumer-kill", "take-1", 6, 8)
    h.fault("consumer-kill", "take-1", 15, 16)
    h.final(29)
    (tmp_path / "history").mkdir()
    with open(tmp_path / "history" / "all.jsonl", "w") as f:
        f.writelines(e.line() + "\n" for e in h.events)
    config = {"duration_s": 20, "grace_s": 1.0, "late_bound_ms": 100, "fsync": "always",
              "topology": "standalone"}  # fmt: skip
    (tmp_path / "result.json").write_text(json.dumps({"config": config}))
    run = Run.load(tmp_path)
    table = markdown([run])
    faults = [line.split(" | ")[2] for line in table.splitlines()[2:]]
    assert faults == ["consumer-kill", "redis-pause", "(combined: 2+ kinds at once)", "(none)"]
    assert "| valid |" in totals([run])
    ET.fromstring(svg([run]))  # well-formed, with a shaded window per fault
    assert svg([run]).count("<title>") == 3


def test_an_error_that_proves_nothing_was_written_is_a_fail_and_any_other_is_unknown() -> None:
    from bench.soak.history import classify

    from delayq import InvalidDelay, LeaseLost, RedisUnavailable, ServerError

    assert classify(LeaseLost("gone")) == "fail"
    assert classify(InvalidDelay("negative")) == "fail"
    assert classify(ServerError("OOM command not allowed when used memory > 'maxmemory'")) == "fail"
    assert classify(RedisUnavailable("timeout")) == "unknown"
    assert classify(ServerError("READONLY You can't write against a read only replica")) == (
        "unknown"
    )


def test_the_soak_refuses_a_fault_it_does_not_know_before_starting_anything(capsys) -> None:  # type: ignore[no-untyped-def]
    from bench.soak.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--faults", "consumer-kill,redis-explode", "--duration", "1"])
    assert exit_info.value.code == 2
    assert "unknown faults: redis-explode" in capsys.readouterr().err


def test_a_delivery_seen_while_the_sampled_master_is_down_is_not_early() -> None:
    """Before: with no clock sample near a worker's handler start (the sampled master was
    killed: a failover), the server's clock was bounded by the samples near the start of the
    span the fetch may lie in, seconds before it, and on-time deliveries counted as early
    (the 2-hour cluster run: 48)."""
    h = H()
    h.clock(4)  # the samples stop at 4 s (the master down) and resume at 12 s
    h.events += [e for e in _samples_from(12, 20)]
    due = h.offer("producer", "a", 3, 6.0)  # due at 9 s: while no sample is taken
    token = "worker-1-a-1"  # a worker's delivery: seen at its handler's start, on time
    h.info("worker-1", "deliver", 9.2, id="a", due_ms=due, delivered_ms=due + 1, attempts=1,
           token=token, key=None)  # fmt: skip
    h.handled("worker-1", "a", 9.3, token)
    h.ack("worker-1", "a", 9.4, token)
    h.final(19.9)
    report = h.check()
    assert report.count("early") == 0, report.anomalies
    # Still early where the delivering server's own clock says so.
    late = H()
    late.clock(4)
    late.events += [e for e in _samples_from(12, 20)]
    due = late.offer("producer", "b", 3, 6.0)
    late.deliver("take-1", "b", 9.2, due, server_ms=due - 500)
    late.final(19.9)
    assert late.check().count("early") == 1


def _samples_from(t0: float, t1: float) -> list[Event]:
    h = H()
    h.clock(t1)
    return [e for e in h.events if e.t >= t0]


def test_a_fault_the_nemesis_gave_up_on_ends_its_window() -> None:
    """Before: a fault whose injection raised (logged as nemesis-error) left its window open
    to the end of the run, excusing everything after it."""
    h = H()
    h.clock(30)
    h.info("nemesis", "fault", 2, id="maxmemory-1", fault="maxmemory", target="redis",
           phase="start")  # fmt: skip
    h.info("harness", "nemesis-error", 2.5, fault="maxmemory", error="TimeoutError()")
    h.final(29.9)
    [window] = h.check(grace_s=1.0).windows
    assert (window.fault, window.start, window.stop, window.end) == ("maxmemory", 2, 2.5, 3.5)

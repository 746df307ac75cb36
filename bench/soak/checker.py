"""The checker: what a soak history proves about delayq, or the counterexample it holds.

Properties (issue #21), each found as a list of :class:`Anomaly`:

- ``lost``: an acknowledged offer (``ok``, outcome created or replaced), not cancelled, that
  was never settled (acked, handled by a worker and gone, or dead-lettered) and is gone at the
  end. A cancel whose outcome is unknown (it raised ``NotDurable``: the master took it, the
  replicas did not confirm in time; or its connection failed) may have taken effect, so the
  task being gone is no loss. ``stuck``: the same, but still in the queue after the drain.
- ``early``: a delivery before the task's due time by the server's clock. The server's time
  at a delivery is bounded from above by the clock samples (``clock`` events: the harness
  reads Redis's ``TIME`` every ~100 ms) over the span in which the fetch can have happened
  (a take's invoke to its reply; for a worker, up to ``WORKER_HOLD_S`` before its handler
  began), so a consumer whose own clock is wrong, or a script that trusted one, cannot hide
  it, and a task fetched before the server's clock stepped back is judged by the clock that
  fetched it.
- ``double-lease``: two live leases of one task: a delivery's ack succeeded although another
  consumer had been handed the task (with a later fencing token, the attempt number) before
  that ack began; or one attempt number handed out twice; or attempts out of real-time order.
- ``after-cancel``: a delivery after a cancel that returned True (by the server's clock).
- ``dedup``: two live tasks of one dedup key at one instant.
- ``duplicate``: a task whose handler ran to completion twice. Explained when the earlier
  delivery's lease lapsed (its ack failed, or its consumer was faulted, or the handler
  outran its lease) or a server-side fault window (Redis killed, paused, partitioned, failed
  over) covers the two; unexplained otherwise.
- ``outbox``: a committed outbox offer never delivered, or a rolled-back one delivered.
- ``late``: the p99 lateness of first deliveries outside fault windows above its bound.

A fault window is [start, end + grace] of a ``fault`` info event pair (the nemesis writes one
at each end).
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import FAIL, INFO, INVOKE, OK, UNKNOWN, Event

# Faults on the server side: a lost ack or lease record there can explain a duplicate.
# Failovers (the nemesis's, or any the sentinels made, observed): a write confirmed by
# WAIT can still be lost in one (WAIT is no consensus: the replica that confirmed may not
# be the one promoted, or the old master took it after a promotion it had not heard of).
FAILOVERS = frozenset({"failover", "master-stop", "split-brain", "failover-observed"})
SERVER_FAULTS = frozenset(
    {"redis-kill", "redis-pause", "redis-sleep", "partition", "failover", "server-clock",
     "maxmemory", "master-stop", "migrate", "split-brain", "failover-observed"}
)  # fmt: skip
# Faults that can lose a write Redis acknowledged (a failover's replication lag, the AOF's
# last second, a partitioned master's writes). A full Redis refuses writes and loses none.
LOSES_WRITES = SERVER_FAULTS - {"maxmemory"}
CLOCK_SLACK_MS = 3  # TIME is whole microseconds, due_ms whole ms, plus the samples' spacing
# A worker's task is fetched into its buffer before its handler begins; the soak's handlers
# take at most ~10 ms (the one slow handler ends its batch), so the fetch was this recent.
WORKER_HOLD_S = 30.0


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str
    task: str
    detail: str
    t: float  # when (monotonic s), for attributing it to a fault window
    explained: str | None = None  # the fault or cause that accounts for it, if any


@dataclass(frozen=True, slots=True)
class Window:
    fault: str
    target: str
    start: float
    stop: float  # when the nemesis healed it
    end: float  # stop plus grace: effects (lapsed leases, catch-up) still unwinding

    def covers(self, t0: float, t1: float | None = None) -> bool:
        return self.start <= (t1 if t1 is not None else t0) and t0 <= self.end


@dataclass
class Delivery:
    task: str
    process: str
    seen: float  # when the consumer had it: an upper bound of the delivery instant
    started: float | None  # the fetch's invoke (a lower bound), None for workers
    due_ms: int
    delivered_ms: int
    attempts: int
    token: str
    handled: bool = False  # the handler ran to completion (and did not raise)
    handled_at: float | None = None
    slow: bool = False  # the handler outran its lease on purpose
    ack: str | None = None  # ok / fail / unknown, or None if this consumer never acked
    ack_invoke: float | None = None


@dataclass
class Offered:
    id: str
    invoke: float
    ok: float
    key: str | None
    durable: bool
    via: str  # queue or outbox
    end: float | None = None  # a lower bound of when it stopped being live
    cancelled: float | None = None  # the cancel's ok time, if it returned True


@dataclass
class Report:
    """What the checker found in one history."""

    operations: int
    offers_ok: int
    deliveries: int
    tasks_delivered: int
    anomalies: list[Anomaly]
    windows: list[Window]
    lateness_ms: list[tuple[float, int]]  # (seen, lateness) of first deliveries
    p99_outside_ms: float | None
    p99_inside_ms: float | None
    recoveries: list[tuple[Window, float]]  # seconds from a fault's end to on time again
    dead: int
    counts: dict[str, int] = field(default_factory=dict)

    def unexplained(self, kind: str | None = None) -> list[Anomaly]:
        return [a for a in self.anomalies if a.explained is None and kind in (None, a.kind)]

    def count(self, kind: str, *, explained: bool | None = None) -> int:
        return sum(
            1 for a in self.anomalies
            if a.kind == kind and (explained is None or (a.explained is not None) == explained)
        )  # fmt: skip

    @property
    def valid(self) -> bool:
        return not self.unexplained()


class _Clock:
    """Redis's clock as seen by the harness's samples: (t, server_ms, rtt_s)."""

    def __init__(self, samples: Sequence[tuple[float, float, float]]) -> None:
        self.samples = sorted(samples)
        self.times = [s[0] for s in self.samples]

    def upper_ms(self, t: float) -> float | None:
        """The highest the server's clock can have read at ``t`` (monotonic s), from the
        samples just before and after it; None without samples near it."""
        k = bisect.bisect_left(self.times, t)
        bounds = []
        # Forward from the sample before (right unless the clock stepped back in between) and
        # back from the one after (right unless it stepped forward); either bound holds
        # unless the clock stepped both ways within one sampling interval.
        if k > 0 and t - self.times[k - 1] < 1.0:
            s_t, s_ms, rtt = self.samples[k - 1]
            bounds.append(s_ms + (t - s_t + rtt / 2) * 1000)
        if k < len(self.times) and self.times[k] - t < 1.0:
            s_t, s_ms, rtt = self.samples[k]
            bounds.append(s_ms + rtt / 2 * 1000)
        return max(bounds) + CLOCK_SLACK_MS if bounds else None

    def upper_ms_over(self, t0: float, t1: float) -> float | None:
        """The highest the server's clock can have read at some instant of [t0, t1]: the
        same as at ``t1`` for a clock that only runs forward, more when it stepped back in
        between (a fetch before the step, seen after it, was made by the clock before).
        Without a sample near ``t1`` (the sampled master was down: a failover), the clock
        runs on from the last sample before it: the bounds at ``t0`` and inside the span
        alone would put the server's clock seconds behind a delivery made at its end."""
        at_end = self.upper_ms(t1)
        if at_end is None:
            k = bisect.bisect_left(self.times, t1)
            if k > 0:
                s_t, s_ms, rtt = self.samples[k - 1]
                at_end = s_ms + (t1 - s_t + rtt / 2) * 1000 + CLOCK_SLACK_MS
        ends = [b for b in (self.upper_ms(t0), at_end) if b is not None]
        lo, hi = bisect.bisect_left(self.times, t0), bisect.bisect_right(self.times, t1)
        inside = [s_ms + rtt / 2 * 1000 + CLOCK_SLACK_MS for _, s_ms, rtt in self.samples[lo:hi]]
        return max(ends + inside) if ends or inside else None


def windows_of(events: Iterable[Event], grace_s: float, end_t: float) -> list[Window]:
    """Fault windows from the nemesis's ``fault`` start/stop pairs (an unended one runs to
    the end of the history). A ``nemesis-error`` ends the open window of its kind (one runs
    at a time): the injection gave up there, and an unended window would excuse everything
    after it."""
    open_: dict[str, Event] = {}
    found = []
    for e in events:
        if e.f == "nemesis-error" and e.type == INFO:
            for name, s in list(open_.items()):
                if s.value["fault"] == e.value.get("fault"):
                    del open_[name]
                    found.append(Window(
                        s.value["fault"], s.value.get("target", ""), s.t, e.t, e.t + grace_s
                    ))  # fmt: skip
            continue
        if e.f != "fault" or e.type != INFO:
            continue
        name = e.value["id"]
        if e.value["phase"] == "start":
            open_[name] = e
        elif name in open_:
            s = open_.pop(name)
            found.append(
                Window(s.value["fault"], s.value.get("target", ""), s.t, e.t, e.t + grace_s)
            )
    for s in open_.values():
        found.append(Window(s.value["fault"], s.value.get("target", ""), s.t, end_t, end_t))
    return sorted(found, key=lambda w: w.start)


def check(
    events: Sequence[Event],
    *,
    grace_s: float = 5.0,
    late_bound_ms: float = 250.0,
    min_offers: int = 0,
) -> Report:
    """Check every property of the history ``events`` (in time order, as :func:`load` gives).
    ``min_offers``: fewer acknowledged offers (or tasks delivered) than this is an ``idle``
    anomaly: a run that did nothing proves nothing."""
    end_t = events[-1].t if events else 0.0
    windows = windows_of(events, grace_s, end_t)
    invokes: dict[tuple[str, int], Event] = {}
    offered: dict[str, Offered] = {}
    unknown_offers: set[str] = set()
    deliveries: dict[str, list[Delivery]] = defaultdict(list)
    by_token: dict[tuple[str, str], Delivery] = {}
    cancel_oks: list[tuple[str, float]] = []
    cancels: dict[str, tuple[float, float, bool]] = {}  # id -> its cancel call: invoke, ok, durable
    cancels_unknown: set[str] = set()  # ids of cancels that may or may not have happened
    commits: dict[str, bool] = {}
    final: dict[str, str] = {}
    clock_samples = []
    operations = 0
    faulted: dict[str, list[Window]] = defaultdict(list)
    for w in windows:
        faulted[w.target].append(w)

    for e in events:
        if e.type == INVOKE:
            invokes[(e.process, e.i)] = e
            operations += 1
            continue
        start = invokes.pop((e.process, e.i), None) if e.type != INFO else None
        v = e.value
        if e.f == "clock" and e.type == INFO:
            clock_samples.append((e.t, float(v["server_ms"]), float(v["rtt"])))
        elif e.f == "final" and e.type == INFO:
            final.update(v["states"])
        elif e.f == "offer" and start is not None:
            sv = start.value
            # "existing" under the caller's own id: a retried offer that had landed before.
            own = (
                v.get("outcome") == "existing" and v.get("id") == sv.get("id") and not sv.get("key")
            )
            if e.type == OK and (v.get("outcome") in ("created", "replaced") or own):
                offered.setdefault(
                    v["id"],
                    Offered(v["id"], start.t, e.t, sv.get("key"), bool(sv.get("durable")),
                            sv.get("via", "queue")),
                )  # fmt: skip
            elif e.type == UNKNOWN and sv.get("id"):
                unknown_offers.add(sv["id"])
        elif e.f == "outbox" and start is not None:
            for task_id in v.get("ids", []):
                if e.type == OK:
                    commits[task_id] = bool(v["commit"])
                    if v["commit"]:
                        offered.setdefault(
                            # Durable in PostgreSQL; in Redis only as much as the relay's
                            # write, which waits for no replica (the relay has no Durability).
                            task_id,
                            Offered(task_id, start.t, e.t, None, False, "outbox"),
                        )
                elif e.type == UNKNOWN:
                    unknown_offers.add(task_id)
        elif e.f == "cancel" and start is not None and e.type == OK and v.get("cancelled"):
            cancel_oks.append((start.value["id"], e.t))
            cancels[start.value["id"]] = (start.t, e.t, bool(start.value.get("durable")))
            if start.value["id"] in offered:
                offered[start.value["id"]].cancelled = e.t
                _ended(offered[start.value["id"]], start.t)
        elif e.f == "cancel" and start is not None and e.type == UNKNOWN:
            cancels_unknown.add(start.value["id"])
        elif e.f in ("fetch", "deliver") and e.type in (OK, INFO) and v.get("id"):
            d = Delivery(
                v["id"], e.process, e.t, start.t if start is not None else None,
                int(v["due_ms"]), int(v["delivered_ms"]), int(v["attempts"]), v.get("token", ""),
            )  # fmt: skip
            deliveries[d.task].append(d)
            by_token[(d.task, d.token)] = d
        elif e.f == "handled" and e.type == INFO:
            d = by_token.get((v["id"], v.get("token", "")))
            if d is not None:
                d.handled = not v.get("raised")
                d.handled_at = e.t if d.handled else None
                d.slow = bool(v.get("slow"))
                if d.handled and v["id"] in offered:
                    _ended(offered[v["id"]], e.t)
        elif e.f == "ack" and start is not None:
            d = by_token.get((start.value["id"], start.value.get("token", "")))
            if d is not None:
                d.ack, d.ack_invoke = e.type, start.t
                if e.type == OK and d.task in offered:
                    _ended(offered[d.task], start.t)

    clock = _Clock(clock_samples)
    anomalies: list[Anomaly] = []

    def explain(t0: float, t1: float, process: str | None = None) -> str | None:
        for w in windows:
            if w.covers(t0, t1) and (w.fault in SERVER_FAULTS or w.target == _base(process)):
                return f"{w.fault} {w.target}".strip()
        return None

    # Deliveries: early, after a cancel, fencing and double leases, duplicates.
    cancelled_at = dict(cancel_oks)
    via = {task_id: o.via for task_id, o in offered.items()}
    for task_id, ds in deliveries.items():
        for d in ds:
            # The delivery (the fetch) came between its invoke, or for a worker's buffered
            # task at most WORKER_HOLD_S before the handler began, and the moment it was seen.
            upper = clock.upper_ms_over(
                d.started if d.started is not None else d.seen - WORKER_HOLD_S, d.seen
            )
            if d.delivered_ms < d.due_ms or (upper is not None and upper < d.due_ms):
                gap = d.due_ms - min(d.delivered_ms, upper if upper is not None else d.delivered_ms)
                anomalies.append(Anomaly(
                    "early", task_id,
                    f"{d.process} had it at least {gap:.0f} ms before its due time by the server's "
                    f"clock (attempt {d.attempts})", d.seen,
                ))  # fmt: skip
            if task_id in cancelled_at:
                cancel_upper = clock.upper_ms(cancelled_at[task_id])
                if cancel_upper is not None and d.delivered_ms > cancel_upper:
                    # A cancel not made durable may die with the master that took it, as an
                    # offer may; a durable one only in a failover during the call itself.
                    invoked, ok, durable = cancels[task_id]
                    if durable:
                        during = [
                            w for w in windows if w.fault in FAILOVERS and w.covers(invoked, ok)
                        ]
                        cause = f"{during[0].fault} during the cancel (durable)" if during else None
                    else:
                        cause = explain(cancelled_at[task_id], d.seen)
                    anomalies.append(Anomaly(
                        "after-cancel", task_id,
                        f"delivered to {d.process} {d.delivered_ms - cancel_upper:.0f} ms after a "
                        f"{'durable' if durable else 'non-durable'} cancel returned True", d.seen,
                        cause,
                    ))  # fmt: skip
        for life in _incarnations(ds):
            _check_leases(task_id, life, anomalies, explain)
        done = [d for d in sorted(ds, key=lambda d: d.seen) if d.handled]
        for a, b in itertools.pairwise(done):
            reason = None
            if a.ack in (FAIL, UNKNOWN) or (a.ack is None and a.slow):
                reason = "lease lapsed before the ack" if a.ack == FAIL else "ack outcome unknown"
                if a.slow:
                    reason = "handler outran its lease"
            reason = reason or explain(a.seen, b.seen, a.process)
            if reason is None and a.ack is None:
                reason = _own_fault(faulted, a.process, a.seen, b.seen)
            if reason is None and b.attempts < a.attempts:
                # b is the older attempt, handled last: its consumer held it (stopped, say,
                # with the fetch's reply in flight) while its lease lapsed and a took the next.
                fetched = b.started if b.started is not None else b.seen - WORKER_HOLD_S
                reason = _own_fault(faulted, b.process, fetched, b.seen)
            if reason is None and via.get(task_id) == "outbox":
                # A relay killed between Redis's reply and its DELETE's commit offers the
                # batch again; a task acked in between is created anew (docs/outbox.md).
                resends = [
                    w for w in windows if w.fault == "relay-kill" and w.covers(a.seen, b.seen)
                ]
                if resends:
                    reason = f"relay-kill {resends[0].target} (outbox resend)"
            anomalies.append(Anomaly(
                "duplicate", task_id,
                f"handled by {a.process} (attempt {a.attempts}, ack {a.ack}) and again by "
                f"{b.process} (attempt {b.attempts})", b.seen, reason,
            ))  # fmt: skip

    # Offers: lost, stuck, the outbox's committed set, dedup keys.
    dead = sum(1 for s in final.values() if s == "dead")
    # A cancel still running at the end of the history is as unknown as one that raised.
    cancels_unknown.update(e.value["id"] for e in invokes.values() if e.f == "cancel")
    gone_after_unknown_cancel = 0
    for task_id, o in offered.items():
        if o.cancelled is not None:
            continue
        ds = deliveries.get(task_id, [])
        settled = (
            any(d.ack == OK for d in ds)
            or final.get(task_id) == "dead"
            or (any(d.handled for d in ds) and final.get(task_id, "gone") == "gone")
        )
        if settled:
            continue
        state = final.get(task_id, "gone")
        if state == "gone" and task_id in cancels_unknown:
            gone_after_unknown_cancel += 1
        elif state == "gone":
            kind = "outbox" if o.via == "outbox" else "lost"
            # A write that was not made durable may die with the server that took it: a
            # server fault after the offer explains the loss. A durable one has no excuse.
            if o.durable:
                during = [w for w in windows if w.fault in FAILOVERS and w.covers(o.invoke, o.ok)]
                cause = f"{during[0].fault} during the write (durable)" if during else None
            else:
                cause = _server_fault_after(windows, o.invoke)
            anomalies.append(Anomaly(
                kind, task_id,
                f"{'committed outbox' if o.via == 'outbox' else 'acknowledged'} offer "
                f"({'durable' if o.durable else 'not durable'}) never settled and gone at the "
                f"end ({len(ds)} deliveries)", o.ok, cause,
            ))  # fmt: skip
        else:
            anomalies.append(
                Anomaly(
                    "stuck", task_id, f"still {state} after the drain ({len(ds)} deliveries)", o.ok
                )
            )
    for task_id, committed in commits.items():
        if not committed and deliveries.get(task_id):
            anomalies.append(Anomaly(
                "outbox", task_id, "an offer whose transaction rolled back was delivered",
                deliveries[task_id][0].seen,
            ))  # fmt: skip
    by_key: dict[str, list[Offered]] = defaultdict(list)
    for o in offered.values():
        if o.key:
            by_key[o.key].append(o)
    for key, tasks in by_key.items():
        tasks.sort(key=lambda o: o.ok)
        for a, b in itertools.pairwise(tasks):
            if a.end is None and final.get(a.id, "gone") == "gone":
                continue  # no record of its end: cannot prove an overlap
            a_end = a.end if a.end is not None else end_t
            if b.ok < a_end and a.ok < b.ok:
                anomalies.append(Anomaly(
                    "dedup", b.id,
                    f"key {key}: task {b.id} created while {a.id} was still live "
                    f"({a_end - b.ok:.3f} s of overlap)", b.ok, explain(b.ok, a_end),
                ))  # fmt: skip

    # Lateness of first deliveries, in and outside fault windows.
    lateness = []
    for ds in deliveries.values():
        first = min(ds, key=lambda d: d.attempts)
        if first.attempts == 1:
            lateness.append((first.seen, max(0, first.delivered_ms - first.due_ms)))
    lateness.sort()
    inside = [ms for t, ms in lateness if any(w.covers(t) for w in windows)]
    outside_at = [(t, ms) for t, ms in lateness if not any(w.covers(t) for w in windows)]
    outside = [ms for _, ms in outside_at]
    p99_out, p99_in = _p99(outside), _p99(inside)
    if p99_out is not None and p99_out > late_bound_ms:
        anomalies.append(Anomaly(
            "late", "", f"p99 lateness outside fault windows {p99_out:.1f} ms > "
            f"{late_bound_ms:.0f} ms ({len(outside)} deliveries); the latest: "
            f"{_worst_late(outside_at, windows)}", end_t,
        ))  # fmt: skip
    if len(offered) < min_offers or len(deliveries) < min_offers:
        anomalies.append(Anomaly(
            "idle", "", f"{len(offered)} acknowledged offers and {len(deliveries)} tasks "
            "delivered: the history tests nothing", end_t,
        ))  # fmt: skip
    recoveries = [(w, _recovery(w, lateness, late_bound_ms)) for w in windows]
    counts = {
        "unknown_offers": len(unknown_offers),
        "cancelled": len(cancel_oks),
        "cancels_unknown": len(cancels_unknown),
        "gone_after_unknown_cancel": gone_after_unknown_cancel,
        "acks_failed": sum(1 for ds in deliveries.values() for d in ds if d.ack == FAIL),
        "redeliveries": sum(len(ds) - 1 for ds in deliveries.values()),
    }
    return Report(
        operations, len(offered), sum(len(ds) for ds in deliveries.values()), len(deliveries),
        sorted(anomalies, key=lambda a: a.t), windows, lateness, p99_out, p99_in, recoveries,
        dead, counts,
    )  # fmt: skip


def _incarnations(ds: Sequence[Delivery]) -> list[list[Delivery]]:
    """The leased deliveries of one id split into the lives of its task. A task acked and
    then offered again under its id (an outbox relay resending a batch it had applied, a
    producer's retry after the first one ran) starts again at attempt 1: a new life, whose
    leases do not overlap the old one's. A life ended with a successful ack, or (consume()
    and the workers record no ack) with a handler that completed, when the next delivery
    has another due time: a task made again is due by the clock of its new offer, while
    one life's attempt handed out twice would carry the same due time."""
    lives: list[list[Delivery]] = [[]]
    for d in sorted((d for d in ds if d.token), key=lambda d: d.seen):
        life = lives[-1]
        ended = any(
            (p.ack == OK and p.ack_invoke is not None and p.ack_invoke < d.seen)
            or (p.handled_at is not None and p.handled_at < d.seen and p.due_ms != d.due_ms)
            for p in life
        )
        if life and ended and d.attempts <= max(p.attempts for p in life):
            lives.append([d])
        else:
            life.append(d)
    return [life for life in lives if life]


def _check_leases(
    task_id: str,
    life: Sequence[Delivery],
    anomalies: list[Anomaly],
    explain: Callable[[float, float], str | None],
) -> None:
    """Fencing tokens (the attempt numbers) of one life of a task: each handed out once, in
    real-time order, and no ack succeeding after a later attempt was handed out."""
    leased = sorted(life, key=lambda d: (d.attempts, d.seen))
    for a, b in itertools.pairwise(leased):
        if a.attempts == b.attempts:
            anomalies.append(Anomaly(
                "double-lease", task_id,
                f"attempt {a.attempts} handed to {a.process} and {b.process}", b.seen,
                explain(a.seen, b.seen),
            ))  # fmt: skip
        if a.started is not None and a.started > b.seen:
            anomalies.append(Anomaly(
                "double-lease", task_id,
                f"attempt {a.attempts} ({a.process}) began after attempt {b.attempts} "
                f"({b.process}) was handed out: fencing tokens out of order", a.seen,
                explain(b.seen, a.seen),
            ))  # fmt: skip
    for a in leased:
        if a.ack != OK or a.ack_invoke is None:
            continue
        later = [b for b in leased if b.attempts > a.attempts and b.seen < a.ack_invoke]
        if later:
            b = later[0]
            anomalies.append(Anomaly(
                "double-lease", task_id,
                f"{a.process}'s ack of attempt {a.attempts} succeeded although attempt "
                f"{b.attempts} went to {b.process} {a.ack_invoke - b.seen:.3f} s before "
                "that ack began", a.ack_invoke, explain(b.seen, a.ack_invoke),
            ))  # fmt: skip


def _ended(o: Offered, t: float) -> None:
    if o.end is None or t < o.end:
        o.end = t


def _server_fault_after(windows: Sequence[Window], t: float) -> str | None:
    for w in windows:
        if w.fault in LOSES_WRITES and w.end >= t:
            return f"{w.fault} {w.target} (not durable)".replace("  ", " ")
    return None


def _own_fault(faulted: dict[str, list[Window]], process: str, t0: float, t1: float) -> str | None:
    """A fault of the consumer itself (killed, stopped, its clock moved) between its delivery
    and the next: its lease lapsed, so the redelivery is at-least-once doing its job."""
    for w in faulted.get(_base(process), []):
        if w.covers(t0, t1):
            return f"{w.fault} {process}"
    return None


def _base(process: str | None) -> str | None:
    """A client's name without its incarnation (``take-0#2`` -> ``take-0``)."""
    return process.split("#")[0] if process else process


def _worst_late(late: list[tuple[float, int]], windows: list[Window], most: int = 3) -> str:
    """The ``most`` latest deliveries outside the windows, each with the fault whose window
    ended last before it, and how long before: where to look in the history."""
    described = []
    for t, ms in sorted(late, key=lambda pair: -pair[1])[:most]:
        ended = [w for w in windows if w.end <= t]
        last = max(ended, key=lambda w: w.end) if ended else None
        after = f"{t - last.end:.1f} s after {last.fault}'s window" if last else "before any fault"
        described.append(f"{ms} ms at t={t:.1f} ({after})")
    return "; ".join(described)


def _p99(values: Sequence[int]) -> float | None:
    if len(values) < 2:
        return float(values[0]) if values else None
    return float(statistics.quantiles(values, n=100, method="inclusive")[98])


def _recovery(w: Window, lateness: Sequence[tuple[float, int]], bound_ms: float) -> float:
    """Seconds from the fault's end until the last late first delivery (over ``bound_ms``)
    seen inside its window: how long the backlog took to clear; 0 if none was late after."""
    late = [t for t, ms in lateness if w.start <= t <= w.end and ms > bound_ms]
    return max(0.0, max(late) - w.stop) if late else 0.0


def summary(report: Report) -> dict[str, Any]:
    """The figures of one run, as the table in docs/reliability.md shows them."""
    return {
        "operations": report.operations,
        "offers_ok": report.offers_ok,
        "deliveries": report.deliveries,
        "lost": report.count("lost"),
        "lost_unexplained": report.count("lost", explained=False),
        "stuck": report.count("stuck"),
        "duplicated": report.count("duplicate"),
        "duplicated_unexplained": report.count("duplicate", explained=False),
        "early": report.count("early"),
        "double_leases": report.count("double-lease"),
        "after_cancel": report.count("after-cancel"),
        "dedup": report.count("dedup"),
        "outbox": report.count("outbox"),
        "dead": report.dead,
        "p99_outside_ms": report.p99_outside_ms,
        "p99_inside_ms": report.p99_inside_ms,
        **report.counts,
    }

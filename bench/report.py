# ruff: noqa: E501, RUF001  (a document generator: long lines and typographic characters)
"""Regenerates docs/benchmarks.md and docs/img/bench-*.png from bench/results/peers.json.

``python -m bench.report [results.json] [docs_dir]`` redraws them without running anything.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DELAYQ = ("delayq", "delayq-async")
REFERENCE = ("bare-loop",)  # not a peer: a yardstick, left out of the best-peer ratios
NOT_PYTHON = ("bullmq-node",)

Getter = Callable[[dict[str, Any]], Any]


def _median(entry: dict[str, Any], label: str) -> dict[str, Any] | None:
    block = entry.get(label)
    if not isinstance(block, dict):
        return None
    if "unsupported" in block:
        return {"unsupported": block["unsupported"]}
    return block.get("median")


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, int | float):
        if digits == 0:
            return f"{round(value):,}"
        return f"{value:,.{digits}f}"
    return str(value)


class Column:
    def __init__(
        self, title: str, label: str, get: Getter, *, digits: int = 0, better: str | None = None
    ) -> None:
        self.title, self.label, self.get, self.digits, self.better = (
            title,
            label,
            get,
            digits,
            better,
        )

    def value(self, entry: dict[str, Any]) -> Any:
        m = _median(entry, self.label)
        if m is None or "error" in m or "unsupported" in m:
            return None
        try:
            return self.get(m)
        except (KeyError, TypeError):
            return None

    def cell(self, entry: dict[str, Any]) -> str:
        m = _median(entry, self.label)
        if m is None:
            return "—"
        if "unsupported" in m:
            return "—"
        if "error" in m:
            return "error"
        return _fmt(self.value(entry), self.digits)


def _ratio(col: Column, contestants: dict[str, Any], who: str) -> str:
    """delayq ÷ best peer (higher is better) or best peer ÷ delayq (lower is better): > 1 means
    delayq is ahead either way."""
    if col.better is None or who not in contestants:
        return ""
    mine = col.value(contestants[who])
    peers = [
        v
        for name, e in contestants.items()
        if name not in DELAYQ + REFERENCE
        for v in [col.value(e)]
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    if not isinstance(mine, int | float) or not peers:
        return "—"
    if col.better == "higher":
        best = max(peers)
        return f"{mine / best:.2f}×" if best > 0 else "—"
    best = min(peers)
    if mine <= 0:
        return "∞" if best > 0 else "—"
    return f"{best / mine:.2f}×"


def _table(results: dict[str, Any], columns: list[Column], note: str = "") -> list[str]:
    contestants: dict[str, Any] = results.get("contestants", {})
    rows = [
        "| contestant | " + " | ".join(c.title for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name, entry in contestants.items():
        rows.append(f"| {name} | " + " | ".join(c.cell(entry) for c in columns) + " |")
    if any(c.better for c in columns):
        for who in DELAYQ:
            if who in contestants:
                rows.append(
                    f"| *{who} vs best peer* | "
                    + " | ".join(_ratio(c, contestants, who) for c in columns)
                    + " |"
                )
    out = rows
    if note:
        out = [*rows, "", note]
    return out


RATIO_NOTE = (
    "*vs best peer*: a ratio above 1× means delayq is ahead of the best peer in that column — "
    "delayq ÷ best peer where higher is better (rates), best peer ÷ delayq where lower is "
    "better (lateness, memory, commands, time)."
)


def _errors(results: dict[str, Any], labels: list[str]) -> list[str]:
    out = []
    for name, entry in results.get("contestants", {}).items():
        for label in labels:
            m = _median(entry, label)
            if m and "error" in m:
                out.append(f"- {name} / {label}: {m['error'][:300]}")
    return out


def _notes(results: dict[str, Any], labels: list[str]) -> list[str]:
    out = []
    for name, entry in results.get("contestants", {}).items():
        for label in labels:
            m = _median(entry, label)
            if m and m.get("note"):
                out.append(f"- {name} / {label}: {m['note']}")
    return out


def _seconds(text: str) -> float:
    """'10s' / '1.5' -> seconds (the worker CLI's duration syntax, the forms bench uses)."""
    return float(str(text).rstrip("s"))


def _bars(results: dict[str, Any]) -> list[str]:
    """delayq against the bars of issue #5."""
    cs = results.get("contestants", {})

    def med(name: str, label: str) -> dict[str, Any]:
        m = _median(cs.get(name, {}), label) or {}
        return {} if "error" in m or "unsupported" in m else m

    def best_peer(label: str, key: str, python_only: bool = False) -> tuple[str, float] | None:
        skip = DELAYQ + REFERENCE + (NOT_PYTHON if python_only else ())
        vals = [(n, med(n, label).get(key)) for n in cs if n not in skip and med(n, label).get(key)]
        vals = [(n, v) for n, v in vals if isinstance(v, int | float)]
        return max(vals, key=lambda x: x[1]) if vals else None

    rows = ["| bar | measured | verdict |", "|---|---|---|"]
    vt = _seconds(results.get("sizes", {}).get("delayq_visibility") or "30s")

    def add(bar: str, measured: str, ok: bool | None) -> None:
        verdict = "—" if ok is None else ("met" if ok else "**not met**")
        rows.append(f"| {bar} | {measured} | {verdict} |")

    for label, title in (("steady", "lateness-steady"), ("sparse", "lateness-sparse")):
        parts, oks = [], []
        for who in DELAYQ:
            p99 = med(who, label).get("p99_ms")
            if p99 is not None:
                parts.append(f"{who} {p99:.2f} ms")
                oks.append(p99 <= 5)
        add(f"{title} p99 ≤ 5 ms", ", ".join(parts) or "—", all(oks) if oks else None)
        bare = med("bare-loop", label).get("p99_ms")
        if bare:
            best = min((med(w, label).get("p99_ms") or 1e9) for w in DELAYQ)
            add(
                f"{title} p99 within 1.5× of the bare loop in the same run",
                f"best delayq {best:.2f} ms vs bare loop {bare:.2f} ms = {best / bare:.2f}×",
                best <= 1.5 * bare,
            )
    peer = best_peer("burst", "per_s")
    parts, oks = [], []
    for who in DELAYQ:
        rate = med(who, "burst").get("per_s")
        if rate and peer:
            parts.append(f"{who} {rate:,.0f}/s = {rate / peer[1]:.2f}× {peer[0]}")
            oks.append(rate >= 2 * peer[1])
    add(
        "burst 50,000 ≥ 2× the fastest peer, the thread Worker (issue #12) and the AsyncWorker",
        "; ".join(parts) or "—",
        all(oks) if len(oks) == len(DELAYQ) else None,
    )
    big = med("delayq-async", "big")
    if big:
        add(
            f"{big.get('tasks', 0):,} due at once, one AsyncWorker ≥ 20,000/s, none lost/duplicated",
            f"{big.get('per_s', 0):,.0f}/s, lost {big.get('lost')}, duplicated {big.get('duplicated')}",
            big.get("per_s", 0) >= 20_000 and big.get("lost") == 0 and big.get("duplicated") == 0,
        )
    peer = best_peer("enqueue_single", "per_s", python_only=True)
    mine = med("delayq", "enqueue_single").get("per_s")
    if mine and peer:
        add(
            "enqueue one by one ≥ the fastest Python peer",
            f"delayq {mine:,.0f}/s vs {peer[0]} {peer[1]:,.0f}/s",
            mine >= peer[1],
        )
    bulk = med("delayq", "enqueue_bulk").get("per_s")
    if bulk:
        add("bulk enqueue ≥ 80,000/s", f"{bulk:,.0f}/s", bulk >= 80_000)
    mem = med("delayq", "enqueue_single").get("bytes_per_task")
    if mem:
        add("memory ≤ 300 bytes/task (~100-byte payload)", f"{mem:,.0f} bytes", mem <= 300)
    parts, oks = [], []
    for who in DELAYQ:
        idle = med(who, "idle").get("commands_per_s")
        req = med(who, "idle").get("requests_per_s")
        if idle is not None:
            parts.append(f"{who} {idle:.2f} commands/s ({_fmt(req, 2)} requests/s)")
            oks.append(idle <= 2)
    add(
        "idle ≤ 2 Redis commands/s per worker (INFO count, script internals included)",
        ", ".join(parts) or "—",
        all(oks) if oks else None,
    )
    parts, oks = [], []
    for who in DELAYQ:
        crash = med(who, "crash")
        if crash:
            s = crash.get("held_redelivered_s")
            parts.append(
                f"{who}: held {crash.get('held')}, redelivered in {_fmt(s, 1)} s, lost {crash.get('lost')}"
            )
            oks.append(s is not None and s <= vt + 1 and crash.get("lost") == 0)
    add(
        f"crash: redelivered within visibility timeout ({vt:g} s here) + 1 s, none lost",
        "; ".join(parts) or "—",
        all(oks) if oks else None,
    )
    return rows


# What each row measures, the better direction, and how to read it.
LEAD_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("lateness p99, 2,000 tasks over 10 s", "steady", "p99_ms", "lower"),
    ("lateness p99, 40 tasks over 10 s", "sparse", "p99_ms", "lower"),
    ("50,000 due at once, tasks/s", "burst", "per_s", "higher"),
    ("enqueue one by one, tasks/s", "enqueue_single", "per_s", "higher"),
    ("bulk enqueue, tasks/s", "enqueue_bulk", "per_s", "higher"),
    ("memory per task, bytes", "enqueue_single", "bytes_per_task", "lower"),
    ("idle worker, Redis commands/s", "idle", "commands_per_s", "lower"),
)

# Why a peer's row beats delayq's, where it does (hand-kept: a row with none recorded says so).
REASONS: dict[tuple[str, str], str] = {
    ("celery", "steady"): "celery's worker pulls every delayed task into its own memory and "
    "times it there: precise, but a crashed worker's tasks come back only after the broker's "
    "visibility timeout (an hour by default), and it enqueues several times slower",
    ("celery", "sparse"): "as above: every task is timed in the worker's memory",
    ("huey", "enqueue_single"): "huey writes one ZADD member per task; delayq also indexes each "
    "task by id (for get, cancel and dedup) and checks its id; between runs this row moves by "
    "~20% either way",
    ("huey", "enqueue_single:bytes_per_task"): "huey keeps one ZADD member per task; delayq "
    "also keeps each task by id, its attempts and its lease, for get, cancel, dedup and "
    "redelivery",
    ("taskiq", "idle"): "taskiq's scheduler at its default refresh (60 s) looks at Redis once "
    "a minute, and so runs a task due within the minute up to a minute late (its steady and "
    "sparse tasks did not run within the window); at a 1-s refresh it costs ~1,000 commands/s",
    ("bullmq-node", "idle"): "BullMQ's idle worker blocks on a marker key (BZPOPMIN) instead of "
    "looking every few seconds",
    ("bullmq-py", "idle"): "BullMQ's idle worker blocks on a marker key (BZPOPMIN) instead of "
    "looking every few seconds",
}


def _not_leading(results: dict[str, Any]) -> list[str]:
    """Every row where a peer beats the better of delayq's two workers, with the reason."""
    cs = results.get("contestants", {})

    def value(name: str, label: str, key: str) -> float | None:
        m = _median(cs.get(name, {}), label) or {}
        got = None if "error" in m or "unsupported" in m else m.get(key)
        return got if isinstance(got, int | float) and not isinstance(got, bool) else None

    lines = []
    for title, label, key, better in LEAD_METRICS:
        pick = min if better == "lower" else max
        ours = [v for v in (value(w, label, key) for w in DELAYQ) if v is not None]
        if not ours:
            continue
        best = pick(ours)
        for name in cs:
            if name in DELAYQ + REFERENCE:
                continue
            theirs = value(name, label, key)
            if theirs is None or theirs == best or pick(theirs, best) != theirs:
                continue
            if label == "burst" and not (_median(cs[name], label) or {}).get("complete", True):
                continue  # an unfinished drain's rate is of the tasks it reached
            reason = REASONS.get((name, f"{label}:{key}")) or REASONS.get((name, label))
            lines.append(
                f"- **{title}**: {name} {_fmt(theirs, 2 if theirs < 10 else 0)} against "
                f"delayq's {_fmt(best, 2 if best < 10 else 0)}: "
                + (reason or "no reason recorded yet (bench/report.py REASONS)")
                + "."
            )
    return lines or ["delayq leads every row of this run."]


def markdown(results: dict[str, Any], img_prefix: str = "img/") -> str:
    m = results.get("machine", {})
    sizes = results.get("sizes", {})
    cs: dict[str, Any] = results.get("contestants", {})
    rb = results.get("redis_benchmark", {})
    L: list[str] = []
    L += [
        "# Benchmarks: delayq and its peers",
        "",
        "<!-- Generated by `python -m bench` (bench/report.py) from bench/results/peers.json: "
        "edit those, not this file. -->",
        "",
        f"Mode **{results.get('mode')}**, run {results.get('started')}, "
        f"{results.get('wall_s', 0) / 60:.1f} min. Every contestant ran alone, one worker process "
        "at the peer's defaults, against the same private `redis-server` (flushed between runs), "
        "on this machine:",
        "",
        f"- CPU: {m.get('cpu')}, {m.get('cores')} cores ({m.get('platform')})",
        f"- Redis {m.get('redis')} (no persistence), Python {m.get('python')}, Node {m.get('node') or '—'}",
        "- `redis-benchmark -q -t zadd,lpush -n "
        f"{rb.get('n', 0):,}` on the same server: ZADD {_fmt(rb.get('zadd_plain'))}/s, LPUSH "
        f"{_fmt(rb.get('lpush_plain'))}/s; with `-P 16`: ZADD {_fmt(rb.get('zadd_pipeline_16'))}/s, "
        f"LPUSH {_fmt(rb.get('lpush_pipeline_16'))}/s",
        "",
        "How to reproduce, and what each scenario does: [bench/README.md](../bench/README.md). "
        "delayq's own benchmarks (offer vs ZADD, drains, the worker runtime) are in "
        "[benchmarks-core.md](benchmarks-core.md).",
        "",
        "## delayq against the bars of issues #5 and #12",
        "",
        *_bars(results),
        "",
        "## Where delayq does not lead",
        "",
        *_not_leading(results),
        "",
    ]
    fast, slow = sizes.get("repeat_fast", 1), sizes.get("repeat_slow", 1)
    L += [
        "## 1. Enqueue",
        "",
        f"{sizes.get('enqueue_n', 0):,} tasks delayed {sizes.get('enqueue_delay', 0) / 60:.0f} min, "
        f"one call per task (at most {sizes.get('enqueue_cap')} s of calls per run: the rate is over "
        "the tasks done), and with the peer's bulk API (— = none). Time spent in the enqueue calls "
        f"alone; median of {fast} run(s).",
        "",
        *_table(
            results,
            [
                Column(
                    "one by one, tasks/s", "enqueue_single", lambda m: m["per_s"], better="higher"
                ),
                Column("bulk, tasks/s", "enqueue_bulk", lambda m: m["per_s"], better="higher"),
            ],
            RATIO_NOTE,
        ),
        "",
        "## 2. Lateness, steady",
        "",
        f"{sizes.get('steady_n', 0):,} tasks due uniformly over {sizes.get('spread')} s "
        f"(delays {sizes.get('lead')}–{sizes.get('lead', 0) + sizes.get('spread', 0)} s), one "
        "worker. Lateness = handler start − due time, both on this host's `time.time()` clock; "
        f"median of {slow} run(s). *early*: tasks that started before their due time. "
        "*not run*: tasks that had not started by the end of the window (the last due time "
        f"+ {sizes.get('tail')} s): late beyond it, not necessarily lost.",
        "",
        *_table(
            results,
            [
                Column("p50 ms", "steady", lambda m: m["p50_ms"], digits=1, better="lower"),
                Column("p90 ms", "steady", lambda m: m["p90_ms"], digits=1, better="lower"),
                Column("p99 ms", "steady", lambda m: m["p99_ms"], digits=1, better="lower"),
                Column("max ms", "steady", lambda m: m["max_ms"], digits=1, better="lower"),
                Column("delivered", "steady", lambda m: m["delivered"]),
                Column("not run", "steady", lambda m: m["lost"]),
                Column("duplicated", "steady", lambda m: m["duplicated"]),
                Column("early", "steady", lambda m: m["early"]),
            ],
        ),
        "",
        f"![lateness distributions]({img_prefix}bench-lateness.png)",
        "",
        "## 3. Lateness, sparse",
        "",
        f"{sizes.get('sparse_n')} tasks over {sizes.get('spread')} s; median of {slow} run(s).",
        "",
        *_table(
            results,
            [
                Column("p50 ms", "sparse", lambda m: m["p50_ms"], digits=1, better="lower"),
                Column("p99 ms", "sparse", lambda m: m["p99_ms"], digits=1, better="lower"),
                Column("max ms", "sparse", lambda m: m["max_ms"], digits=1, better="lower"),
                Column("not run", "sparse", lambda m: m["lost"]),
                Column("early", "sparse", lambda m: m["early"]),
            ],
        ),
        "",
        "## 4. Burst",
        "",
        f"{sizes.get('burst_n', 0):,} tasks due at the same instant (enqueued ahead, the worker "
        f"already running); seconds from the due instant until the last handler started, capped "
        f"at {sizes.get('burst_cap')} s (a peer still draining at the cap is *incomplete*: its "
        "rate is delivered ÷ cap). Redis commands and Redis CPU per delivered task are counted "
        "from the due instant to the end (INFO deltas, the harness's own INFO calls subtracted).",
        "",
        *_table(
            results,
            [
                Column("seconds", "burst", lambda m: m["seconds"], digits=2, better="lower"),
                Column("tasks/s", "burst", lambda m: m["per_s"], better="higher"),
                Column("delivered", "burst", lambda m: m["delivered"]),
                Column("complete", "burst", lambda m: m["complete"]),
                Column("lost", "burst", lambda m: m["lost"]),
                Column("pending at cap", "burst", lambda m: m["pending_at_cap"]),
                Column("duplicated", "burst", lambda m: m["duplicated"]),
                Column(
                    "Redis cmds/task",
                    "burst",
                    lambda m: m["redis_commands_per_task"],
                    digits=2,
                    better="lower",
                ),
                Column(
                    "Redis CPU µs/task",
                    "burst",
                    lambda m: m["redis_cpu_us_per_task"],
                    digits=1,
                    better="lower",
                ),
                Column(
                    "worker CPU µs/task", "burst", lambda m: m["worker_cpu_us_per_task"], digits=1
                ),
            ],
        ),
        "",
    ]
    big = _median(cs.get("delayq-async", {}), "big")
    if big and "error" not in big:
        L += [
            f"delayq alone, {big.get('tasks', 0):,} tasks due at once (enqueued with `offer_many`) "
            f"drained by ONE `AsyncWorker` process at its defaults: **{_fmt(big.get('per_s'))} "
            f"tasks/s** ({_fmt(big.get('seconds'), 1)} s), lost {big.get('lost')}, duplicated "
            f"{big.get('duplicated')}, {_fmt(big.get('redis_commands_per_task'), 2)} Redis "
            f"commands and {_fmt(big.get('redis_cpu_us_per_task'), 1)} µs of Redis CPU per task.",
            "",
        ]
    elif big:
        L += [f"delayq alone, the big drain: error: {big['error'][:300]}", ""]
    L += [
        f"![burst drain curves]({img_prefix}bench-burst.png)",
        "",
        "## 5. Memory",
        "",
        "Redis `used_memory` after − before the one-by-one enqueue runs, per stored delayed task "
        '(payload ≈ 100 bytes as JSON: `{"i": …, "due": …, "pad": "x" * 50}`).',
        "",
        *_table(
            results,
            [Column("bytes/task", "enqueue_single", lambda m: m["bytes_per_task"], better="lower")],
        ),
        "",
        "## 6. Idle cost",
        "",
        f"One idle worker with {sizes.get('idle_n', 0):,} tasks scheduled an hour ahead (peers "
        f"without a bulk API: as many as {sizes.get('idle_topup_cap')} s of one-by-one calls "
        "enqueue, see *scheduled*). The worker starts first, then the tasks arrive. Every "
        "contestant runs this scenario at the same time, each on a Redis server of its own "
        "(an idle worker's rate is set by its timers; the enqueueing is done one contestant at "
        f"a time). After at least {sizes.get('idle_settle')} s, the harness waits "
        "until two consecutive 1-s command rates agree (at most "
        f"{sizes.get('idle_settle_cap')} s in all: *settle*), then measures over "
        f"{sizes.get('idle_window')} s: Redis commands/s (INFO `total_commands_processed`, the "
        "harness's own calls subtracted; it includes the commands Lua scripts run), requests/s "
        "(commands the worker sent, counted with MONITOR, script internals left out), the worker's CPU (its whole process tree, psutil) and "
        "Redis's CPU.",
        "",
        *_table(
            results,
            [
                Column(
                    "Redis cmds/s", "idle", lambda m: m["commands_per_s"], digits=2, better="lower"
                ),
                Column(
                    "requests/s", "idle", lambda m: m["requests_per_s"], digits=2, better="lower"
                ),
                Column(
                    "worker CPU %", "idle", lambda m: m["worker_cpu_pct"], digits=2, better="lower"
                ),
                Column(
                    "Redis CPU %", "idle", lambda m: m["redis_cpu_pct"], digits=2, better="lower"
                ),
                Column("scheduled", "idle", lambda m: m["scheduled"]),
                Column("settle s", "idle", lambda m: m["settle_s"], digits=1),
            ],
        ),
        "",
        "## 7. Crash",
        "",
        f"{sizes.get('crash_n')} tasks due now; a worker whose handler records and then sleeps "
        "for an hour takes as many as its defaults let it (*held*), then its whole process group "
        "gets SIGKILL and a fresh worker starts. *held back in*: seconds from the kill until the "
        "last held task started again; *all 100 in*: until every task had started under the "
        f"fresh worker; both capped at {sizes.get('crash_cap')} s (— = not within the cap). "
        "*lost*: tasks that never started under the fresh worker within the cap. Like the idle "
        "scenario, every contestant runs it at the same time on a Redis server of its own; "
        "getting the tasks held and the kill are done one contestant at a time.",
        "",
        *_table(
            results,
            [
                Column("held", "crash", lambda m: m["held"]),
                Column("held back in, s", "crash", lambda m: m["held_redelivered_s"], digits=1),
                Column("all in, s", "crash", lambda m: m["all_delivered_s"], digits=1),
                Column("redelivered", "crash", lambda m: m["redelivered"]),
                Column("lost", "crash", lambda m: m["lost"], better="lower"),
            ],
        ),
        "",
        "## Versions and settings",
        "",
        "| contestant | version | settings changed from the defaults, and why | wall time |",
        "|---|---|---|---|",
    ]
    for name, entry in cs.items():
        L.append(
            f"| {name} | {entry.get('version')} | {entry.get('settings')} | "
            f"{_fmt(entry.get('wall_s'))} s |"
        )
    L += ["", "For every contestant, the handler only appends `i due start` to a file."]
    unavailable = results.get("unavailable") or {}
    if unavailable:
        L += ["", "Could not run here:", ""]
        L += [f"- **{name}**: {reason}" for name, reason in unavailable.items()]
    labels = ["enqueue_single", "enqueue_bulk", "steady", "sparse", "burst", "big", "idle", "crash"]
    errors = _errors(results, labels)
    if errors:
        L += ["", "Runs that failed:", "", *errors]
    notes = _notes(results, labels)
    if notes:
        L += ["", "Notes from the runs:", "", *notes]
    L += [
        "",
        "## Caveats",
        "",
        f"- Medians of {fast} run(s) for enqueue/memory and {slow} run(s) for the other "
        "scenarios (so that sixteen contestants fit in about 25 minutes); single runs are noisy on a shared VM.",
        "- Redis, the worker and the harness share the machine's cores; the harness sleeps or "
        "polls a file while workers run.",
        "- Every peer runs at its defaults, which trade latency for load differently: peers that "
        "poll for due tasks every 0.5–1 s (arq, saq, rq, huey) are late by up to that interval "
        "by design, and their defaults decide how many tasks a crashed worker holds.",
        "- The crash scenario kills the whole process group (as a lost machine or container "
        "would), then starts a fresh worker; recovery that needs the peer's own timeout (often "
        "minutes) shows as — within the cap.",
        "- Enqueue rates include each library's client-side work (serialisation, ids) and one "
        "round trip per call on a loopback connection.",
        "",
    ]
    return "\n".join(L)


# -- plots -----------------------------------------------------------------------------------


def plots(results: dict[str, Any], img: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    img.mkdir(parents=True, exist_ok=True)
    written = []
    cs: dict[str, Any] = results.get("contestants", {})

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, label, title in zip(axes, ("steady", "sparse"), ("steady", "sparse"), strict=True):
        for name, entry in cs.items():
            m = _median(entry, label)
            lat = (m or {}).get("lateness_sample") or []
            if not lat:
                continue
            xs = [max(x, 0.01) for x in lat]
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            style = "-" if name in DELAYQ else "--"
            ax.step(xs, ys, style, where="post", label=name, linewidth=2 if name in DELAYQ else 1)
        ax.set_xscale("log")
        ax.set_xlabel("lateness, ms (log)")
        ax.set_title(f"lateness-{title}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("fraction of tasks started")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = img / "bench-lateness.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, entry in cs.items():
        m = _median(entry, "burst")
        curve = (m or {}).get("drain_curve") or []
        if not curve:
            continue
        xs = [max(p[0], 0.001) for p in curve]
        ys = [p[1] for p in curve]
        style = "-" if name in DELAYQ else "--"
        ax.plot(xs, ys, style, label=name, linewidth=2 if name in DELAYQ else 1)
    ax.set_xscale("log")
    ax.set_xlabel("seconds since the due instant (log)")
    ax.set_ylabel("tasks delivered")
    n = results.get("sizes", {}).get("burst_n", 0)
    ax.set_title(f"burst: {n:,} tasks due at once, one worker")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = img / "bench-burst.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written


def write(results: dict[str, Any], docs: Path) -> list[Path]:
    docs.mkdir(parents=True, exist_ok=True)
    written = plots(results, docs / "img")
    path = docs / "benchmarks.md"
    path.write_text(markdown(results))
    return [path, *written]


if __name__ == "__main__":
    src = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "results" / "peers.json"
    )
    docs = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).parents[1] / "docs"
    for p in write(json.loads(src.read_text()), docs):
        print(f"wrote {p}")

"""The Prometheus alerting rules (docs/alerts.yml), their promtool unit tests
(docs/alerts-tests.yml) and the Grafana dashboard (docs/grafana-dashboard.json).

promtool comes from Debian's ``prometheus`` package (.ci/run installs it). Without it the
promtool tests skip, except under DELAYQ_REQUIRE_ALL_REDIS (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
RULES = DOCS / "alerts.yml"
RULE_TESTS = DOCS / "alerts-tests.yml"
DASHBOARD = DOCS / "grafana-dashboard.json"

# The metric names delayq exports (issue #4). TODO: take these from delayq.metrics.
QUEUE_METRICS = {
    "delayq_tasks",
    "delayq_overdue_tasks",
    "delayq_oldest_overdue_age_seconds",
    "delayq_next_due_timestamp_seconds",
    "delayq_consumer_last_seen_timestamp_seconds",
    "delayq_offered_total",
    "delayq_delivered_total",
    "delayq_acked_total",
    "delayq_retried_total",
    "delayq_dead_lettered_total",
    "delayq_cancelled_total",
    "delayq_expired_total",
    "delayq_lease_expired_total",
    "delayq_decode_failures_total",
    "delayq_requeued_total",
    "delayq_purged_total",
    "delayq_queue_paused",
    "delayq_limit_waiting",
    "delayq_limit_running",
    "delayq_limit_throttled_total",
    "delayq_exporter_up",
    "delayq_exporter_scrape_duration_seconds",
    # `delayq exporter --dsn` (metrics/_outbox.py)
    "delayq_outbox_up",
    "delayq_outbox_pending_rows",
    "delayq_outbox_dead_rows",
    "delayq_outbox_oldest_pending_age_seconds",
    "delayq_outbox_relays_alive",
    # recurring schedules (issue #19)
    "delayq_schedule_fires_total",
    "delayq_schedule_next_fire_timestamp_seconds",
    "delayq_schedule_last_success_timestamp_seconds",
    "delayq_schedule_period_seconds",
    "delayq_schedule_paused",
}
WORKER_METRICS = {
    "delayq_worker_tasks_total",
    "delayq_worker_in_progress",
    "delayq_worker_last_heartbeat_timestamp_seconds",
    "delayq_worker_up",
}
HISTOGRAMS = {
    "delayq_delivery_lateness_seconds",
    "delayq_worker_lateness_seconds",
    "delayq_worker_handler_duration_seconds",
    "delayq_worker_end_to_end_seconds",
}
KNOWN_METRICS = (
    QUEUE_METRICS
    | WORKER_METRICS
    | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | {"up"}  # Prometheus's own per-target series
)

ALERTS = {
    "DelayqOverdueNotDraining",
    "DelayqDeadLetterGrowing",
    "DelayqNoWorkerHeartbeat",
    "DelayqLeasesExpired",
    "DelayqWorkerDown",
    "DelayqHighLateness",
    "DelayqExporterDown",
    "DelayqOutboxNoRelay",
    "DelayqOutboxLagging",
    "DelayqOutboxDeadRows",
    "DelayqScheduleStuck",
    "DelayqScheduleNoSuccess",
    "DelayqQueuePausedTooLong",
}
# Alerts whose series may carry no queue label (a whole exporter or a never-scraped worker,
# an outbox table).
WITHOUT_QUEUE = {"DelayqExporterDown", "DelayqOutboxNoRelay", "DelayqOutboxLagging",
                 "DelayqOutboxDeadRows"}  # fmt: skip

PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (good enough for our own expressions)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)\b(\s*\()?", expr):
        word, call = match.groups()
        if call is None and word.lower() not in PROMQL_WORDS:
            names.add(word)
    return names


def test_metric_names_parser() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (queue, le) "
        '(rate(delayq_delivery_lateness_seconds_bucket{queue=~"$queue"}[5m])))'
        ' > 1 and on (job, instance) up{job="x"} == 0 or absent(dealyq_typo) - time()'
    )
    assert metric_names(expr) == {"delayq_delivery_lateness_seconds_bucket", "up", "dealyq_typo"}


# -- alerts.yml, read without a YAML library: the layout is ours and fixed ---------------------


def parse_rules(text: str) -> dict[str, dict[str, Any]]:
    """alert name -> {expr, for, labels, annotations}, from our own rules layout."""
    alerts: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] = {}
    block: tuple[str, int, list[str]] | None = None  # (key, indent, lines) of a | or >- value
    section = None

    def finish(key: str, lines: list[str]) -> None:
        if key == "expr":
            current["expr"] = "\n".join(lines).strip()
        else:  # folded annotation
            current["annotations"][key] = " ".join(x for x in lines if x)

    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if block is not None:
            if not stripped or indent > block[1]:
                block[2].append(stripped)
                continue
            finish(block[0], block[2])
            block = None
        if not stripped or stripped.startswith("#"):
            continue
        if m := re.fullmatch(r"- alert: (\w+)", stripped):
            current = {"labels": {}, "annotations": {}}
            alerts[m.group(1)] = current
            section = None
            continue
        if not current:
            continue
        key, _, value = stripped.partition(":")
        value = value.strip()
        if key in ("labels", "annotations") and not value:
            section = key
        elif value in ("|", ">-", ">"):
            block = (key, indent, [])
        elif key == "expr":
            current["expr"] = value
        elif key == "for":
            current["for"] = value
        elif section is not None:
            current[section][key] = value.strip('"')
    if block is not None:
        finish(block[0], block[2])
    return alerts


@pytest.fixture(scope="module")
def rules() -> dict[str, dict[str, Any]]:
    return parse_rules(RULES.read_text())


def test_every_alert_is_defined_with_for_severity_and_annotations(
    rules: dict[str, dict[str, Any]],
) -> None:
    assert set(rules) == ALERTS
    for name, rule in rules.items():
        assert rule.get("expr"), name
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: no for:"
        assert rule["labels"].get("severity") in ("warning", "critical"), name
        summary = rule["annotations"].get("summary", "")
        description = rule["annotations"].get("description", "")
        assert summary and description, name
        if name not in WITHOUT_QUEUE:
            assert "$labels.queue" in summary + description, name


def test_alerts_use_only_known_metrics(rules: dict[str, dict[str, Any]]) -> None:
    for name, rule in rules.items():
        used = metric_names(rule["expr"])
        assert used, name
        assert used <= KNOWN_METRICS, f"{name}: unknown metrics {used - KNOWN_METRICS}"


# -- the Grafana dashboard -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows' nested panels included."""
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner["title"], target["expr"]))
    return found


def test_dashboard_is_an_importable_grafana_dashboard(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["queue"]["type"] == "query"
    assert variables["queue"]["definition"] == "label_values(delayq_tasks, queue)"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["refId"], panel["title"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_dashboard_uses_only_known_metrics(dashboard: dict[str, Any]) -> None:
    for title, expr in dashboard_exprs(dashboard):
        used = metric_names(expr)
        assert used, f"{title}: {expr}"
        assert used <= KNOWN_METRICS, f"{title}: unknown metrics {used - KNOWN_METRICS}"


def test_dashboard_covers_issue_4(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(e) for _, e in dashboard_exprs(dashboard)))
    for metric in (
        "delayq_tasks",
        "delayq_overdue_tasks",
        "delayq_oldest_overdue_age_seconds",
        "delayq_offered_total",
        "delayq_delivered_total",
        "delayq_acked_total",
        "delayq_delivery_lateness_seconds_bucket",
        "delayq_dead_lettered_total",
        "delayq_worker_handler_duration_seconds_bucket",
        "delayq_consumer_last_seen_timestamp_seconds",
    ):
        assert metric in used, metric


# -- promtool ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("DELAYQ_REQUIRE_ALL_REDIS"):
            pytest.fail("CI needs promtool (Debian package prometheus) to test the alert rules")
        pytest.skip("promtool not installed (apt-get install prometheus) to test the alert rules")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_checks_the_rules(promtool: str) -> None:
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = run(promtool, "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param(") > 1\n", ") > 10\n", id="lateness-threshold"),
        pytest.param("> 120\n", "> 600\n", id="consumer-silence"),
        pytest.param(
            "increase(delayq_dead_lettered_total[30m]) > 0",
            "increase(delayq_dead_lettered_total[30m]) > 5",
            id="dead-letter-threshold",
        ),
        pytest.param(
            "deriv(delayq_overdue_tasks[10m]) >= 0",
            "deriv(delayq_overdue_tasks[10m]) >= -1e9",
            id="draining-check",
        ),
        pytest.param(
            'absent(up{job="delayq-exporter"})', 'absent(up{job="other"})', id="exporter-absent"
        ),
        pytest.param("for: 2m", "for: 20m", id="pending-period"),
        pytest.param(
            'delta(delayq_tasks{state="dead"}[30m])) > 0',
            'delta(delayq_tasks{state="dead"}[30m])) > 5',
            id="dead-set-growth",
        ),
        pytest.param(
            "heartbeat_timestamp_seconds > 120",
            "heartbeat_timestamp_seconds > 1200",
            id="heartbeat",
        ),
        pytest.param("delayq_exporter_up == 0", "delayq_exporter_up == 2", id="exporter-redis"),
        pytest.param(
            'delayq_tasks{state="expired"} > 0', 'delayq_tasks{state="expired"} > 5', id="expired"
        ),
        pytest.param("for: 3m", "for: 10m", id="expired-pending-period"),
        pytest.param(
            "delayq_outbox_relays_alive == 0",
            "delayq_outbox_relays_alive < 0",
            id="outbox-no-relay",
        ),
        pytest.param(
            "delayq_outbox_pending_rows > 0",
            "delayq_outbox_pending_rows > 1e9",
            id="outbox-no-relay-pending",
        ),
        pytest.param(
            "delayq_outbox_oldest_pending_age_seconds > 120",
            "delayq_outbox_oldest_pending_age_seconds > 1200",
            id="outbox-lag",
        ),
        pytest.param(
            "delayq_outbox_dead_rows > 0", "delayq_outbox_dead_rows > 5", id="outbox-dead"
        ),
        pytest.param(
            "rate(delayq_delivered_total[5m]) == 0",
            "rate(delayq_delivered_total[5m]) < 0",
            id="no-deliveries",
        ),
        pytest.param(
            "clamp_min(delayq_schedule_period_seconds, 60)\n        for",
            "clamp_min(delayq_schedule_period_seconds, 6000)\n        for",
            id="schedule-stuck-period",
        ),
        pytest.param("3 * clamp_min", "30 * clamp_min", id="schedule-success-periods"),
        pytest.param(
            "delayq_schedule_paused == 1", "delayq_schedule_paused == 2", id="schedule-paused"
        ),
    ],
)
def test_promtool_unit_tests_catch_a_broken_rule(
    promtool: str, tmp_path: Path, old: str, new: str
) -> None:
    """The unit tests are not vacuous: each of these rule changes makes them fail."""
    text = RULES.read_text()
    assert old in text
    (tmp_path / "alerts.yml").write_text(text.replace(old, new))
    shutil.copy(RULE_TESTS, tmp_path / "alerts-tests.yml")
    assert run(promtool, "check", "rules", str(tmp_path / "alerts.yml")).returncode == 0
    result = run(promtool, "test", "rules", str(tmp_path / "alerts-tests.yml"))
    assert result.returncode != 0, result.stdout
    assert "FAILED" in result.stdout + result.stderr


def test_promtool_parses_every_dashboard_query(
    promtool: str, dashboard: dict[str, Any], tmp_path: Path
) -> None:
    """Each panel query, with Grafana's variables filled in, is valid PromQL."""
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for i, (_, expr) in enumerate(dashboard_exprs(dashboard)):
        filled = (
            expr.replace("$__rate_interval", "1m").replace("$__range", "1h").replace("$queue", ".*")
        )
        assert "$" not in filled, expr
        lines += [f"      - record: dashboard:query_{i}", f"        expr: {json.dumps(filled)}"]
    rules_file = tmp_path / "dashboard-queries.yml"
    rules_file.write_text("\n".join(lines) + "\n")
    result = run(promtool, "check", "rules", str(rules_file))
    assert result.returncode == 0, result.stdout + result.stderr

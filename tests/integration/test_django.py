"""delayq.contrib.django end to end: the shop in tests/django_project on a private PostgreSQL
database and a private Redis, through its real views, migrations and management commands."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")
psycopg = pytest.importorskip("psycopg")

from delayq import DelayQueue, EncodeError, TaskState  # noqa: E402
from delayq._sync.reshard import reshard  # noqa: E402
from delayq.embedded import EmbeddedRedis, free_port  # noqa: E402
from delayq.outbox import Relay  # noqa: E402
from tests.conftest import BINARIES  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.topology import Node  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1] / "django_project"
ADMIN_DSN = os.environ.get("PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


def _postgres_up() -> bool:
    try:
        psycopg.connect(ADMIN_DSN, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


pytestmark = pytest.mark.skipif(not _postgres_up(), reason=f"no PostgreSQL at {ADMIN_DSN}")


@pytest.fixture(scope="module")
def project(redis7_server: EmbeddedRedis) -> Iterator[dict[str, str]]:
    """Django set up on the shop project, migrated into a database of its own (dropped
    afterwards); returns the environment a ``manage.py`` subprocess needs."""
    name = f"delayq_django_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    env = {
        "DELAYQ_TEST_DB": name,
        "REDIS_URL": redis7_server.url,
        "DELAYQ_PREFIX": f"dj{uuid.uuid4().hex[:8]}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.path.insert(0, str(PROJECT))
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        yield env
    finally:
        from django.db import connections

        from delayq.contrib.django import close_queues

        close_queues()
        connections.close_all()
        sys.path.remove(str(PROJECT))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def client(project: dict[str, str]) -> Any:
    from django.test import Client

    return Client()


@pytest.fixture
def queue(project: dict[str, str]) -> Iterator[DelayQueue]:
    """The shop's orders queue, read directly (not the integration's shared object)."""
    q = DelayQueue("orders", project["REDIS_URL"], prefix=project["DELAYQ_PREFIX"])
    yield q
    q.close()


@pytest.fixture
def relay(project: dict[str, str]) -> Iterator[Relay]:
    from delayq.contrib.django.database import conninfo

    with Relay(conninfo(), project["REDIS_URL"]) as running:
        assert running.wait_connected(10)
        yield running


def outbox_rows(task_id: str) -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM delayq_outbox WHERE task_id = %s", [task_id])
        return int(cur.fetchone()[0])


def order(order_id: int) -> Any:
    from shop.models import Order

    return Order.objects.get(id=order_id)


def manage(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PROJECT / "manage.py"), *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then the exit status must be 0; returns what the process printed."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


# -- the outbox path -------------------------------------------------------------------------


def test_migration_made_the_outbox_table(project: dict[str, str]) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass('delayq_outbox') IS NOT NULL")
        assert cur.fetchone()[0] is True


def test_placed_order_has_its_task_in_redis(client: Any, queue: DelayQueue, relay: Relay) -> None:
    reply = client.post("/orders/?delay=30")
    assert reply.status_code == 201
    placed = reply.json()
    info = wait_until(lambda: queue.get(placed["close_task_id"]))
    assert info.state is TaskState.DELAYED
    assert info.payload == {"order_id": placed["id"]}
    assert info.key == f"close:{placed['id']}"
    assert order(placed["id"]).close_task_id == placed["close_task_id"]
    wait_until(lambda: outbox_rows(placed["close_task_id"]) == 0)  # relayed rows are removed


def test_rolled_back_offer_leaves_no_row(project: dict[str, str]) -> None:
    from django.db import transaction
    from shop.models import Order

    from delayq.contrib import django as delayq_django

    offered: list[str] = []
    with pytest.raises(RuntimeError), transaction.atomic():
        created = Order.objects.create()
        offered.append(delayq_django.offer("orders", {"order_id": created.id}, delay=1))
        assert outbox_rows(offered[0]) == 1  # visible inside the transaction
        raise RuntimeError("the view failed after the offer")
    assert outbox_rows(offered[0]) == 0
    assert not Order.objects.filter(id=created.id).exists()


def test_savepoint_rollback_drops_only_its_offer(
    project: dict[str, str], queue: DelayQueue, relay: Relay
) -> None:
    from django.db import transaction

    from delayq.contrib import django as delayq_django

    with transaction.atomic():
        kept = delayq_django.offer("orders", {"order_id": -1}, delay=30)
        with pytest.raises(ValueError), transaction.atomic():
            dropped = delayq_django.offer("orders", {"order_id": -2}, delay=30)
            raise ValueError("inner block fails")
    assert wait_until(lambda: queue.get(kept)).state is TaskState.DELAYED
    assert outbox_rows(dropped) == 0
    assert queue.get(dropped) is None
    queue.cancel(kept)


def test_bad_payload_raises_inside_the_transaction(project: dict[str, str]) -> None:
    from django.db import transaction
    from shop.models import Order

    from delayq.contrib import django as delayq_django

    before = Order.objects.count()
    with pytest.raises(EncodeError), transaction.atomic():
        Order.objects.create()
        delayq_django.offer("orders", {"order_id": object()}, delay=1)
    assert Order.objects.count() == before


def test_pay_cancels_the_close_task(client: Any, queue: DelayQueue, relay: Relay) -> None:
    placed = client.post("/orders/?delay=30").json()
    wait_until(lambda: queue.get(placed["close_task_id"]))
    assert client.post(f"/orders/{placed['id']}/pay/").status_code == 200
    wait_until(lambda: queue.get(placed["close_task_id"]) is None)
    assert order(placed["id"]).status == "paid"
    assert client.post(f"/orders/{placed['id']}/pay/").status_code == 409


def test_pay_before_the_relay_ran_never_reaches_redis(client: Any, queue: DelayQueue) -> None:
    """No relay runs while the order is placed and paid: the offer row is dropped by the
    cancel, and a relay started afterwards creates no task."""
    from delayq.contrib.django.database import conninfo

    placed = client.post("/orders/?delay=30").json()
    assert client.post(f"/orders/{placed['id']}/pay/").status_code == 200
    relay = Relay(conninfo(), os.environ["REDIS_URL"])
    relay.relay_pending()
    assert queue.get(placed["close_task_id"]) is None
    assert outbox_rows(placed["close_task_id"]) == 0


# -- the management commands -----------------------------------------------------------------


def test_worker_command_closes_unpaid_orders_only(
    project: dict[str, str], client: Any, relay: Relay
) -> None:
    worker = manage(project, "delayq_worker", "--queue", "orders", "--concurrency", "2")
    try:
        unpaid = [client.post("/orders/?delay=0.3").json() for _ in range(3)]
        paid = client.post("/orders/?delay=0.6").json()
        assert client.post(f"/orders/{paid['id']}/pay/").status_code == 200
        wait_until(lambda: all(order(o["id"]).status == "closed" for o in unpaid), timeout=20)
    finally:
        out = stop(worker)
    assert "delayq worker stopped" in out
    for placed in unpaid:
        closed = order(placed["id"])
        assert closed.closed_at is not None
        assert closed.close_deliveries == 1
    assert order(paid["id"]).status == "paid"
    assert order(paid["id"]).close_deliveries == 0


def test_worker_command_dispatches_a_sharded_queue_by_its_name(
    project: dict[str, str], client: Any, relay: Relay
) -> None:
    """Django's dispatch is by ``task.queue.name``: on a sharded queue, the logical name."""
    # Earlier tests made "orders" unsharded: move it live to 4 shards (both layouts drain).
    reshard("orders", project["REDIS_URL"], shards=4, prefix=project["DELAYQ_PREFIX"])
    worker = manage(project, "delayq_worker", "--queue", "orders", "--concurrency", "2")
    try:
        unpaid = [client.post("/orders/?delay=0.2").json() for _ in range(6)]
        wait_until(lambda: all(order(o["id"]).status == "closed" for o in unpaid), timeout=20)
    finally:
        out = stop(worker)
    assert "KeyError" not in out and "Traceback" not in out, out
    assert all(order(o["id"]).close_deliveries == 1 for o in unpaid)


@pytest.mark.slow
def test_worker_command_on_sigterm_finishes_running_handlers_and_hands_back_the_rest(
    project: dict[str, str], tmp_path: Path
) -> None:
    """manage.py delayq_worker as the process manager stops it: SIGTERM while it runs two slow
    handlers and holds more tasks fetched ahead. The handlers finish within the grace
    (DELAYQ["WORKER"]["grace"] = 5), the other tasks are ready again at once (their lease is
    30 s), the command exits 0, and no task is lost."""
    receipts = DelayQueue("receipts", project["REDIS_URL"], prefix=project["DELAYQ_PREFIX"])
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(PROJECT / "manage.py"), "delayq_worker", "--queue", "receipts",
             "--concurrency", "2"],
            env={**os.environ, **project}, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        ids = [receipts.offer({"seconds": 1.5}) for _ in range(12)]
        wait_until(lambda: log.read_text().count("sending receipt") == 2, timeout=20)
        wait_until(lambda: receipts.stats().inflight > 2, timeout=10)  # some fetched ahead
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out_text = log.read_text()
    assert proc.returncode == 0, out_text
    assert "delayq worker: SIGTERM received, shutting down" in out_text
    sent = re.findall(r"sent receipt (\S+)", out_text)
    assert len(sent) == 2, out_text
    assert "delayq worker stopped: processed=2" in out_text
    stats = receipts.stats()
    assert stats.inflight == 0
    assert stats.counters["acked"] == 2
    assert stats.ready == len(ids) - 2
    left = {task_id for task_id in ids if task_id not in sent}
    assert all(receipts.get(task_id).state is TaskState.READY for task_id in left)  # type: ignore[union-attr]
    receipts.purge(["ready"])
    receipts.close()


def test_relay_command_moves_committed_offers(
    project: dict[str, str], client: Any, queue: DelayQueue
) -> None:
    proc = manage(project, "delayq_relay", "--sweep-interval", "1", "--batch-bytes", "64KiB")
    try:
        placed = client.post("/orders/?delay=30").json()
        info = wait_until(lambda: queue.get(placed["close_task_id"]), timeout=20)
        assert info.state is TaskState.DELAYED
    finally:
        out = stop(proc)
    assert "delayq relay stopped" in out
    queue.cancel(placed["close_task_id"])


def test_relay_command_once_relays_what_is_pending_and_exits(
    project: dict[str, str], client: Any, queue: DelayQueue
) -> None:
    placed = client.post("/orders/?delay=30").json()  # committed: its row waits for a relay
    assert queue.get(placed["close_task_id"]) is None
    out, _ = manage(project, "delayq_relay", "--once").communicate(timeout=60)
    assert out.strip().splitlines()[-1] == "relayed 1 rows", out
    info = queue.get(placed["close_task_id"])
    assert info is not None and info.state is TaskState.DELAYED
    out, _ = manage(project, "delayq_relay", "--once").communicate(timeout=60)
    assert out.strip().splitlines()[-1] == "relayed 0 rows", out
    queue.cancel(placed["close_task_id"])


@pytest.fixture
def replicated() -> Iterator[tuple[Node, Node]]:
    """A master and its replica, the replica in sync."""
    binary = BINARIES[0][1]
    master = Node(binary).start()
    replica = Node(binary, extra_args=["--replicaof", "127.0.0.1", str(master.port)]).start()
    try:
        wait_until(lambda: replica.info("replication")["master_link_status"] == "up", 15)
        yield master, replica
    finally:
        with contextlib.suppress(RuntimeError):
            replica.resume()
        replica.stop()
        master.stop()


def test_relay_command_waits_for_the_replica_that_the_queue_options_ask_for(
    project: dict[str, str], replicated: tuple[Node, Node], tmp_path: Path
) -> None:
    """OPTIONS["durability"] through manage.py delayq_relay: a row is deleted once the
    replica has its task; with the replica frozen the rows stay, the relay logs NotDurable and
    retries (each retry refused by the receipts, so tasks acked meanwhile are not created
    again), and once the replica is back the rows go. One delivery each."""
    from django.db import transaction

    from delayq.contrib import django as delayq_django

    master, replica = replicated
    env = {**project, "REDIS_URL": master.url, "DELAYQ_TEST_DURABILITY_S": "0.5"}
    queue = DelayQueue("orders", master.url, prefix=project["DELAYQ_PREFIX"])
    log_path = tmp_path / "relay.log"
    with open(log_path, "w") as log:  # a file, not a pipe: retries must never block on it
        proc = subprocess.Popen(
            [sys.executable, str(PROJECT / "manage.py"), "delayq_relay", "--sweep-interval", "1"],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        # (a) The replica answers: the row goes once the replica has the task.
        with transaction.atomic():
            first = delayq_django.offer("orders", {"order_id": 1}, delay=60)
        wait_until(lambda: outbox_rows(first) == 0, timeout=30)
        with replica.client() as on_replica:
            assert on_replica.hexists(queue.keys.key("tasks"), first)  # no wait: it was there
        with master.client() as on_master:
            assert on_master.info("commandstats")["cmdstat_wait"]["calls"] >= 1

        # (b) The replica frozen: the tasks reach the master, the rows stay.
        replica.pause()
        with transaction.atomic():
            ids = [delayq_django.offer("orders", {"order_id": n}, delay=0) for n in range(3)]
        wait_until(lambda: all(queue.get(task_id) is not None for task_id in ids), timeout=20)
        delivered = []
        while len(delivered) < 3:  # a consumer takes them meanwhile, as it would
            task = queue.poll(timeout=5)
            assert task is not None
            delivered.append(task.id)
            task.ack()
        # Two more tries, each refused by the receipts (counted as it starts, before its WAIT):
        # the first of them also fell short, or the second would not have come.
        refused = queue.stats().counters.get("applied_before", 0)
        wait_until(
            lambda: queue.stats().counters.get("applied_before", 0) >= refused + 6, timeout=20
        )
        assert [outbox_rows(task_id) for task_id in ids] == [1, 1, 1]

        # The replica back: the next try is confirmed and the rows go.
        replica.resume()
        wait_until(lambda: all(outbox_rows(task_id) == 0 for task_id in ids), timeout=30)
        assert sorted(delivered) == sorted(ids)
        assert queue.poll(timeout=0.5) is None  # none of them created again
        assert queue.stats().counters["offered"] == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        queue.close()
    out = log_path.read_text()
    assert proc.returncode == 0, out
    assert "outbox relay: Redis: NotDurable: queue 'orders': 3 task(s) written but not" in out
    retries = re.search(r"recovered after (\d+) failed attempt\(s\)", out)
    assert retries is not None and int(retries.group(1)) >= 2, out


def scrape(port: int) -> str:
    """The body of ``/metrics`` on ``port``, or '' while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


def test_worker_and_relay_commands_serve_metrics(
    project: dict[str, str], client: Any, queue: DelayQueue
) -> None:
    """Before: neither command could serve /metrics (the CLI's worker and relay can)."""
    worker_port, relay_port = free_port(), free_port()
    worker = manage(project, "delayq_worker", "--queue", "orders", "--metrics-port",
                    str(worker_port))  # fmt: skip
    relay = manage(project, "delayq_relay", "--sweep-interval", "1", "--metrics-port",
                   str(relay_port))  # fmt: skip
    try:
        placed = client.post("/orders/?delay=0.2").json()
        wait_until(lambda: order(placed["id"]).status == "closed", timeout=20)
        body = wait_until(lambda: _with(scrape(worker_port), "delayq_worker_tasks_total"), 20)
        assert 'queue="orders"' in body and "delayq_queue_" in body
        body = wait_until(lambda: _with(scrape(relay_port), "delayq_outbox_relayed_total"), 20)
        assert "# TYPE delayq_outbox_pending gauge" in body
    finally:
        worker_out, relay_out = stop(worker), stop(relay)
    assert f"metrics on http://127.0.0.1:{worker_port}/metrics" in worker_out
    assert f"metrics on http://127.0.0.1:{relay_port}/metrics" in relay_out
    assert "cannot read the table" not in relay_out  # the outbox's rows were read
    assert scrape(worker_port) == scrape(relay_port) == ""  # both servers stopped


def _with(body: str, name: str) -> str | None:
    return body if name in body else None


def test_metrics_on_a_port_in_use_is_a_clear_error(project: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for command in ("delayq_worker", "delayq_relay"):
            out, _ = manage(project, command, "--metrics-port", str(port)).communicate(timeout=60)
            assert f"127.0.0.1:{port}" in out and "Traceback" not in out, out
    out, _ = manage(project, "delayq_worker", "--metrics-port", "70000").communicate(timeout=60)
    assert "--metrics-port must be from 0 to 65535" in out


def test_worker_command_without_a_handler_is_a_clear_error(project: dict[str, str]) -> None:
    proc = manage(project, "delayq_worker", "--queue", "no-such-queue")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "DELAYQ['QUEUES']['no-such-queue'] has no HANDLER" in out
    assert "Traceback" not in out


def test_relay_command_on_a_dead_database_alias_is_a_clear_error(
    project: dict[str, str],
) -> None:
    proc = manage(project, "delayq_relay", "--database", "nope")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "unknown database 'nope'" in out
    assert "Traceback" not in out


def test_relay_command_refuses_a_sweep_interval_that_never_wakes(
    project: dict[str, str],
) -> None:
    proc = manage(project, "delayq_relay", "--sweep-interval", "inf")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "sweep_interval must be finite" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("4MB", "not a size for --batch-bytes: '4MB' (bytes, or a number with KiB, MiB or GiB"),
        ("0", "batch_bytes must be an int from 1 to 1073741824 (1 GiB), got 0"),
    ],
)
def test_relay_command_refuses_a_batch_bytes_that_cannot_work(
    project: dict[str, str], value: str, message: str
) -> None:
    proc = manage(project, "delayq_relay", "--batch-bytes", value)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert message in out
    assert "Traceback" not in out


# -- the on_commit path ----------------------------------------------------------------------


def test_on_commit_offers_after_the_commit_only(project: dict[str, str], queue: DelayQueue) -> None:
    from django.db import transaction

    from delayq.contrib import django as delayq_django

    with transaction.atomic():
        task_id = delayq_django.offer_on_commit("orders", {"order_id": -3}, delay=30)
        assert queue.get(task_id) is None  # nothing in Redis before the commit
    assert queue.get(task_id).state is TaskState.DELAYED  # sent by the commit itself
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = delayq_django.offer_on_commit("orders", {"order_id": -4}, delay=30)
        raise RuntimeError("rolled back")
    assert queue.get(lost) is None
    queue.cancel(task_id)


def test_on_commit_keeps_the_callers_trace_context(
    project: dict[str, str], queue: DelayQueue
) -> None:
    """The offer is sent by the commit, maybe after the caller's span ended (ATOMIC_REQUESTS):
    it carries the caller's trace context, captured at the call (issue #22)."""
    pytest.importorskip("opentelemetry.sdk")
    from django.db import transaction
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from delayq.contrib import django as delayq_django

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(TracerProvider())  # once per process, whoever is first
    with transaction.atomic():
        with trace.get_tracer("shop").start_as_current_span("POST /orders") as view:
            task_id = delayq_django.offer_on_commit("orders", {"order_id": -5}, delay=30)
        assert not trace.get_current_span().get_span_context().is_valid  # the view's is over
    info = queue.get(task_id)
    assert info is not None
    assert info.headers["traceparent"].split("-")[1] == f"{view.get_span_context().trace_id:032x}"
    queue.cancel(task_id)


def test_on_commit_views_place_and_cancel(client: Any, queue: DelayQueue) -> None:
    placed = client.post("/on-commit/orders/?delay=30").json()
    assert queue.get(placed["close_task_id"]).key == f"close:{placed['id']}"
    assert client.post(f"/on-commit/orders/{placed['id']}/pay/").status_code == 200
    assert queue.get(placed["close_task_id"]) is None


def test_on_commit_bad_input_raises_before_the_commit(project: dict[str, str]) -> None:
    from django.db import transaction

    from delayq import InvalidDelay
    from delayq.contrib import django as delayq_django

    with pytest.raises(InvalidDelay), transaction.atomic():
        delayq_django.offer_on_commit("orders", {"order_id": 1}, delay=-1)


def test_on_commit_with_redis_down_loses_the_task_and_says_so(
    project: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The limit the docs state: the transaction commits, the task cannot be sent."""
    from django.db import transaction
    from django.test import override_settings
    from shop.models import Order

    from delayq.contrib import django as delayq_django

    settings = {
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        "QUEUES": {"orders": {"OPTIONS": {"reconnect_timeout": 0.2}}},
    }
    with override_settings(DELAYQ=settings), caplog.at_level(logging.ERROR, "delayq.django"):
        with transaction.atomic():
            created = Order.objects.create()
            task_id = delayq_django.offer_on_commit("orders", {"order_id": created.id}, delay=1)
        assert Order.objects.filter(id=created.id).exists()  # committed without its task
    assert f"offer of task {task_id} on queue orders lost after its transaction committed" in (
        caplog.text
    )


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"REDIS": "x"}, "DELAYQ: unknown key REDIS"),
        ({"QUEUES": []}, "DELAYQ['QUEUES'] must be a dict"),
        ({"QUEUES": {"orders": {"HANDLER": "nodots"}}}, "must be a dotted path"),
        ({"QUEUES": {"orders": {"OPTION": {}}}}, "unknown key OPTION"),
        ({"DATABASE": "other"}, "'other', which is not in DATABASES"),
        ({"WORKER": {"concurency": 2}}, "unknown key concurency"),
        ({"PREFIX": ""}, "DELAYQ['PREFIX'] must be a non-empty string"),
        ({"WORKER": {"grace": -1}}, "DELAYQ['WORKER']['grace']: grace must be >= 0"),
        ({"WORKER": {"timeout": "60"}}, "DELAYQ['WORKER']['timeout']: timeout must be seconds"),
    ],
)
def test_bad_settings_are_named(
    project: dict[str, str], setting: dict[str, Any], message: str
) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from delayq.contrib.django import delayq_settings

    with (
        override_settings(DELAYQ=setting),
        pytest.raises(ImproperlyConfigured, match=re.escape(message)),
    ):
        delayq_settings()


def test_worker_durations_are_seconds_or_timedeltas(project: dict[str, str]) -> None:
    from django.test import override_settings

    from delayq.contrib.django.worker import build_worker

    setting = {
        "QUEUES": {"orders": "shop.tasks.close_order"},
        "WORKER": {"timeout": timedelta(minutes=1), "grace": timedelta(seconds=5)},
    }
    with override_settings(DELAYQ=setting):
        worker, queues = build_worker(["orders"], {"visibility_timeout": timedelta(seconds=20)})
    for queue in queues:
        queue.close()
    assert (worker._options.timeout, worker._options.grace) == (60.0, 5.0)
    assert worker._queues[0].policy.visibility_timeout == 20.0


def test_bad_queue_options_are_named(project: dict[str, str]) -> None:
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from delayq.contrib.django import get_queue

    setting = {"QUEUES": {"orders": {"OPTIONS": {"max_attempts": 0}}}}
    with (
        override_settings(DELAYQ=setting),
        pytest.raises(ImproperlyConfigured, match=r"\['orders'\]\['OPTIONS'\]: max_attempts"),
    ):
        get_queue("orders")


def test_the_reporter_filter_masks_urls_and_dsns_in_settings(project: dict[str, str]) -> None:
    """Django's own filter keys settings by name: DELAYQ["REDIS_URL"] showed whole."""
    from delayq.contrib.django.reporting import SafeUrlReporterFilter

    cleanse = SafeUrlReporterFilter().cleanse_setting
    delayq = cleanse("DELAYQ", {"REDIS_URL": "redis://:s3cret@cache:6379/0", "PREFIX": "dq"})
    assert delayq == {"REDIS_URL": "redis://:***@cache:6379/0", "PREFIX": "dq"}
    assert cleanse("OUTBOX_DSN", "host=db password=s3cret") == "host=db password=***"
    assert cleanse("LOGIN_URL", "/login/") == "/login/"
    assert cleanse("SECRET_KEY", "k") != "k"  # Django's own rule still applies

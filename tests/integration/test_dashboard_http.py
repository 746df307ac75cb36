"""The web dashboard over HTTP (httpx on the ASGI app), against a real Redis and real tasks.

The sampler is not started here (no lifespan); tests call ``sample_once`` when they need
history. The dashboard does not depend on the Redis version, so the newest server only.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from delayq import AsyncDelayQueue, ConfigError, Stats
from delayq.cli import main
from delayq.dashboard import Settings, create_app
from delayq.dashboard.app import Dashboard
from delayq.dashboard.security import check_bind
from delayq.dashboard.series import History, Sample, bins_of, health, quantile
from delayq.embedded import EmbeddedRedis, free_port

FIELDS = ("delayed", "ready", "inflight", "expired", "dead", "overdue")
XSS = "<script>alert('xss')</script>"


@pytest.fixture
async def queues(redis7_server: EmbeddedRedis, prefix: str) -> AsyncIterator[Callable[..., Any]]:
    made: list[AsyncDelayQueue] = []

    def make(name: str = "q", **options: Any) -> AsyncDelayQueue:
        q = AsyncDelayQueue(name, redis7_server.url, prefix=prefix, **options)
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


@pytest.fixture
async def dash(redis7_server: EmbeddedRedis, prefix: str) -> AsyncIterator[Callable[..., Any]]:
    made: list[tuple[httpx.AsyncClient, Dashboard]] = []

    def make(**options: Any) -> tuple[httpx.AsyncClient, Dashboard]:
        options.setdefault("redis_url", redis7_server.url)
        app = create_app(Settings(prefix=prefix, **options))
        # A browser sends its page's origin on every POST; the dashboard refuses any other.
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
            headers={"origin": "http://127.0.0.1"},
        )  # fmt: skip
        made.append((client, app.state.dashboard))
        return client, app.state.dashboard

    yield make
    for client, board in made:
        await client.aclose()
        await board.monitor.close()


def shown(html: str, row_marker: str) -> dict[str, int]:
    """The counts a row (``data-queue="name"`` or ``id="totals"``) shows, by field."""
    row = html[html.index(row_marker) :]
    row = row[: row.index("</tr>")]
    return {f: int(v) for f, v in re.findall(r'data-field="(\w+)">(\d+)<', row)}


def form_fields(html: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', html))


async def fill(q: AsyncDelayQueue, delayed: int, ready: int, inflight: int, dead: int) -> None:
    for i in range(dead + inflight):
        await q.offer({"n": i}, delay=0)
    for task in await q.poll_many(dead + inflight) if dead + inflight else []:
        if dead:
            await q.reject(task, "boom")
            dead -= 1
    for i in range(ready):  # due 5 s ago: overdue for the dashboard (overdue_after 1 s)
        await q.offer({"r": i}, at=time.time() - 5)
    for i in range(delayed):
        await q.offer({"d": i}, delay=600)


async def test_main_page_counts_equal_stats(queues: Any, dash: Any) -> None:
    a, b, c = queues("alpha"), queues("beta"), queues("gamma")
    await fill(a, delayed=3, ready=2, inflight=1, dead=1)
    await fill(b, delayed=7, ready=0, inflight=2, dead=3)
    await fill(c, delayed=1, ready=0, inflight=0, dead=0)
    client, _ = dash()
    response = await client.get("/")
    assert response.status_code == 200
    stats: list[Stats] = [await q.stats() for q in (a, b, c)]
    for st in stats:
        assert shown(response.text, f'data-queue="{st.queue}"') == {
            **{f: getattr(st, f) for f in FIELDS}
        }
    totals = shown(response.text, 'id="totals"')
    assert totals == {f: sum(getattr(st, f) for st in stats) for f in FIELDS}
    assert stats[0].ready == 2 and stats[1].dead == 3  # the fixture made what it says
    # alpha's consumer fetched just now and its tasks are overdue: late, not stuck.
    assert stats[0].overdue == 2 and 'class="late" data-queue="alpha"' in response.text


async def test_stuck_queue_is_highlighted(queues: Any, dash: Any) -> None:
    q = queues("stale")
    await q.offer({"x": 1}, at=time.time() - 5)  # overdue, and no consumer ever fetched
    client, _ = dash()
    response = await client.get("/")
    assert 'class="stuck" data-queue="stale"' in response.text
    assert "1 stuck" in response.text


async def test_stats_of_many_queues_take_one_pipelined_round(queues: Any, dash: Any) -> None:
    for i in range(30):
        await queues(f"q{i:02d}").offer({"i": i}, delay=60)
    _, board = dash()
    await board.monitor.snapshot()  # loads the script
    names = await board.monitor.names()
    rounds: list[int] = []
    runner = board.monitor.runner
    original = runner._exchange_mixed

    async def counting(calls: Any) -> Any:
        rounds.append(len(calls))
        return await original(calls)

    runner._exchange_mixed = counting
    try:
        snap = await board.monitor.snapshot(names)
        assert rounds == [30]  # 30 stats scripts, one pipelined round
        rounds.clear()
        chunked = await board.monitor.snapshot(names, chunk=12)  # as the sampler reads
    finally:
        del runner._exchange_mixed
    assert len(snap.stats) == 30 and all(s.delayed == 1 for s in snap.stats)
    assert rounds == [12, 12, 6]  # rounds the event loop can serve pages between
    assert [s.queue for s in chunked.stats] == [s.queue for s in snap.stats]


async def test_queue_page_pages_through_tasks(queues: Any, dash: Any) -> None:
    q = queues("big")
    await q.offer_many([({"i": i}, 100 + i) for i in range(120)])
    client, _ = dash()
    expected = [t.id for t in await q.tasks("delayed", 120)]
    seen = []
    for page in (1, 2, 3):
        response = await client.get(f"/q/big?state=delayed&page={page}")
        assert response.status_code == 200
        assert f"page {page} of 3" in response.text
        seen += re.findall(r'<a href="/q/big/task\?id=([^"]+)">', response.text)
    assert seen == expected
    last = (await client.get("/q/big?state=delayed&page=3")).text
    assert 'rel="next"' not in last and 'rel="prev"' in last
    assert "No ready tasks" in (await client.get("/q/big?state=ready")).text
    assert (await client.get("/q/big?state=nonsense")).status_code == 404
    assert (await client.get("/q/bad%20name")).status_code == 404


async def test_task_detail_shows_everything_and_escapes_payloads(queues: Any, dash: Any) -> None:
    q = queues("xss", max_attempts=5)
    task_id = await q.offer(
        {"order": 42, "note": XSS}, delay=0, headers={"trace": XSS}, key="close:42"
    )
    task = await q.poll(1)
    assert task is not None
    await q.retry(task, delay=30, error=f"failed with {XSS}")
    client, _ = dash()
    html = (await client.get(f"/q/xss/task?id={task_id}")).text
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;" in html  # payload, header, error
    assert html.count("&lt;script&gt;") == 3
    assert "&#34;order&#34;: 42" in html  # pretty-printed JSON
    assert 'data-field="attempts">1<' in html and "close:42" in html
    listing = (await client.get("/q/xss?state=delayed")).text
    assert "<script>alert" not in listing and "&lt;script&gt;" in listing
    assert (await client.get("/q/xss/task?id=nope")).status_code == 404


async def test_task_page_shows_its_history_and_its_end(queues: Any, dash: Any) -> None:
    q = queues("hist", history=60, max_attempts=5)
    task_id = await q.offer({"order": 42}, delay=0)
    task = await q.poll(1)
    assert task is not None
    await q.retry(task, delay=0, error=f"ValueError: {XSS}")
    client, _ = dash()
    live = (await client.get(f"/q/hist/task?id={task_id}")).text
    assert 'id="history"' in live and 'data-kind="retried"' in live
    assert "<script>alert" not in live and "ValueError: &lt;script&gt;" in live
    assert re.findall(r'data-kind="([\w-]+)"', live) == ["offered", "delivered", "retried"]
    task = await q.poll(1)
    assert task is not None
    await task.ack()
    ended = (await client.get(f"/q/hist/task?id={task_id}")).text
    assert 'badge state-done">done<' in ended and 'data-field="ended_at"' in ended
    assert "acked" in ended and "payload went with it" in ended
    assert re.findall(r'data-kind="([\w-]+)"', ended)[-2:] == ["delivered", "acked"]
    assert "confirm?action=" not in ended  # nothing left to act on
    plain = queues("plain")
    await plain.offer("x", delay=0)
    page = (await client.get(f"/q/plain/task?id={await plain.offer('y', delay=60)}")).text
    assert 'id="history"' not in page  # a queue without histories shows none


async def test_actions_need_the_csrf_token(queues: Any, dash: Any) -> None:
    q = queues("orders")
    task_id = await q.offer({"x": 1}, delay=600)
    client, _ = dash()
    page = await client.get(f"/q/orders/confirm?action=cancel&id={task_id}")
    fields = form_fields(page.text)
    assert fields["action"] == "cancel" and fields["id"] == task_id and fields["csrf"]
    for bad in ({**fields, "csrf": ""}, {**fields, "csrf": "x" * 43}, {"action": "cancel"}):
        response = await client.post("/q/orders/action", data=bad)
        assert response.status_code == 403 and "CSRF" in response.text
    assert (await q.get(task_id)) is not None
    # A cookie-less client (another site's forged form) fails even with a token value.
    async with httpx.AsyncClient(
        transport=client._transport, base_url="http://localhost", headers=client.headers
    ) as other:
        assert (await other.post("/q/orders/action", data=fields)).status_code == 403
    response = await client.post("/q/orders/action", data=fields)
    assert response.status_code == 303
    assert await q.get(task_id) is None
    done = await client.get(response.headers["location"])
    assert f"Task {task_id} cancelled." in done.text


async def test_task_actions_through_their_confirmation(queues: Any, dash: Any) -> None:
    q = queues("ops")
    later = await q.offer({"later": 1}, delay=600)
    resched = await q.offer({"resched": 1}, delay=600)
    client, _ = dash()

    async def act(action: str, task_id: str, **extra: str) -> str:
        page = await client.get(f"/q/ops/confirm?action={action}&id={task_id}")
        assert page.status_code == 200, page.text
        response = await client.post("/q/ops/action", data={**form_fields(page.text), **extra})
        assert response.status_code == 303, response.text
        return (await client.get(response.headers["location"])).text

    assert f"Task {later} rescheduled." in await act("run_now", later)
    info = await q.get(later)
    assert info is not None and info.state == "ready"
    before = datetime.now(UTC)
    await act("reschedule", resched, delay="2h")
    info = await q.get(resched)
    assert info is not None and info.due_at is not None
    assert abs(info.due_at - before - timedelta(hours=2)) < timedelta(seconds=30)
    page = await client.get(f"/q/ops/confirm?action=reschedule&id={resched}")
    bad = await client.post("/q/ops/action", data={**form_fields(page.text), "delay": "soon"})
    assert bad.status_code == 400 and "not a delay" in bad.text
    assert "it is no longer waiting" not in await act("cancel", resched)
    assert await q.get(resched) is None
    assert "it is no longer waiting" in await act("cancel", resched)


async def test_dead_letter_actions(queues: Any, dash: Any) -> None:
    q = queues("dl")
    for i in range(4):
        await q.offer({"i": i}, delay=0)
    for task in await q.poll_many(4):
        await q.reject(task, "bad")
    ids = [t.id for t in await q.tasks("dead")]
    client, _ = dash()

    async def act(action: str, task_id: str = "") -> str:
        page = await client.get(f"/q/dl/confirm?action={action}&id={task_id}")
        response = await client.post("/q/dl/action", data=form_fields(page.text))
        assert response.status_code == 303
        return (await client.get(response.headers["location"])).text

    assert "1 dead task(s) requeued." in await act("requeue", ids[0])
    assert (await q.stats()).dead == 3 and (await q.get(ids[0])).state == "ready"  # type: ignore[union-attr]
    confirm = (await client.get("/q/dl/confirm?action=purge_dead")).text
    assert "<strong>3</strong> dead task(s)" in confirm
    assert "1 dead task(s) purged." not in await act("requeue_all")
    assert (await q.stats()).dead == 0 and (await q.stats()).ready == 4
    for task in await q.poll_many(2):
        await q.reject(task, "again")
    assert "2 dead task(s) purged." in await act("purge_dead")
    assert (await q.stats()).dead == 0


async def test_token_is_required_everywhere(queues: Any, dash: Any) -> None:
    q = queues("secret")
    task_id = await q.offer({"x": 1}, delay=600)
    client, _ = dash(token="s3cret-token-0123")
    response = await client.get("/q/secret")
    assert response.status_code == 303
    assert response.headers["location"] == "/login?next=/q/secret"
    assert (await client.get("/", headers={"authorization": "Bearer wrong"})).status_code == 401
    ok = await client.get("/", headers={"authorization": "Bearer s3cret-token-0123"})
    assert ok.status_code == 200 and 'data-queue="secret"' in ok.text
    confirm = await client.get(
        f"/q/secret/confirm?action=cancel&id={task_id}",
        headers={"authorization": "Bearer s3cret-token-0123"},
    )
    fields = form_fields(confirm.text)
    assert (await client.post("/q/secret/action", data=fields)).status_code == 401
    assert await q.get(task_id) is not None
    login = await client.get("/login?next=/q/secret")
    wrong = await client.post("/login", data={**form_fields(login.text), "token": "nope"})
    assert wrong.status_code == 401 and "Wrong token" in wrong.text
    signing_in = {**form_fields(login.text), "token": "s3cret-token-0123"}
    right = await client.post("/login", data=signing_in)
    assert right.status_code == 303 and right.headers["location"] == "/q/secret"
    cookie = right.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "s3cret" not in cookie
    assert (await client.get("/q/secret")).status_code == 200
    # The form's CSRF token is bound to the session: the one rendered before signing in fails.
    assert (await client.post("/q/secret/action", data=fields)).status_code == 403
    signed_in = await client.get(f"/q/secret/confirm?action=cancel&id={task_id}")
    response = await client.post("/q/secret/action", data=form_fields(signed_in.text))
    assert response.status_code == 303 and await q.get(task_id) is None
    # login's next= never leaves the site
    evil = await client.post(
        "/login",
        data={**form_fields(login.text), "next": "//evil.example", "token": "s3cret-token-0123"},
    )
    assert evil.headers["location"] == "/"


async def test_read_only_hides_and_rejects_actions(queues: Any, dash: Any) -> None:
    q = queues("ro")
    task_id = await q.offer({"x": 1}, delay=600)
    writer, _ = dash()
    fields = form_fields((await writer.get(f"/q/ro/confirm?action=cancel&id={task_id}")).text)
    client, board = dash(read_only=True)
    page = (await client.get(f"/q/ro/task?id={task_id}")).text
    assert "read-only" in page and "confirm?action" not in page
    assert (await client.get(f"/q/ro/confirm?action=cancel&id={task_id}")).status_code == 403
    await client.get("/")  # a CSRF cookie of its own
    # A valid CSRF token for this browser (a read-only dashboard renders no form to take it
    # from): the refusal is read-only's, not the CSRF check's.
    own = board.signer.form_token(board.signer.nonce(client.cookies["delayq_csrf"]), None)
    response = await client.post("/q/ro/action", data={**fields, "csrf": own})
    assert "read-only" in response.text
    assert response.status_code == 403
    assert await q.get(task_id) is not None


async def test_redis_down_is_a_clear_503(dash: Any) -> None:
    client, _ = dash(redis_url=f"redis://127.0.0.1:{free_port()}/0", reconnect_timeout=0.5)
    for path in ("/", "/q/any", "/q/any/task?id=x"):
        start = time.monotonic()
        response = await client.get(path)
        assert response.status_code == 503, path
        assert "Redis is unavailable" in response.text and "Traceback" not in response.text
        assert time.monotonic() - start < 5


async def test_charts_come_from_sampled_history(queues: Any, dash: Any) -> None:
    q = queues("flow")
    client, board = dash()
    await q.offer({"x": 0}, delay=0)
    await board.sample_once()
    assert "no data yet" in (await client.get("/q/flow")).text
    for i in range(5):
        await q.offer({"i": i}, delay=0)
    for task in await q.poll_many(6):
        await q.ack(task)
    await asyncio.sleep(0.05)  # a measurable interval between the two samples
    await board.sample_once()
    html = (await client.get("/q/flow")).text
    assert "no data yet" not in html
    assert re.search(r"delivered: [\d,.]+ /min", html) and "<polyline" not in html  # one point
    assert html.count("<circle") >= 2


async def test_without_a_token_only_loopback_host_names_are_served(dash: Any) -> None:
    """A page whose name was rebound to 127.0.0.1 (DNS rebinding) sends its own Host header."""
    client, _ = dash()
    assert (await client.get("/")).status_code == 200
    for host in ("localhost:8080", "127.0.0.1:8080"):
        assert (await client.get("/", headers={"host": host})).status_code == 200
    rebound = await client.get("/", headers={"host": "attacker.example:8080"})
    assert rebound.status_code == 400
    # With a token too: a rebinding page could otherwise guess it from a victim's browser.
    bearer = {"authorization": "Bearer s3cret-token-0123"}
    tokened, _ = dash(token="s3cret-token-0123")
    named = await tokened.get("/", headers={"host": "queues.internal", **bearer})
    assert named.status_code == 400
    assert (await tokened.get("/", headers={"host": "localhost:8080", **bearer})).status_code == 200
    allowed, _ = dash(token="s3cret-token-0123", allowed_hosts=("queues.internal",))
    named = await allowed.get("/", headers={"host": "queues.internal:8080", **bearer})
    assert named.status_code == 200
    assert (await allowed.get("/", headers={"host": "evil.example", **bearer})).status_code == 400


def test_binding_beyond_loopback_needs_a_token() -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", "t" * 16, ("queues.internal",))
    check_bind("192.168.1.10", "t" * 16)
    for host in ("0.0.0.0", "192.168.1.10", "::"):
        with pytest.raises(ConfigError):
            check_bind(host, None)
    with pytest.raises(ConfigError, match="--allowed-host"):  # only loopback names would work
        check_bind("0.0.0.0", "t" * 16)
    assert main(["dashboard", "--host", "0.0.0.0", "--redis", "redis://127.0.0.1:1/0"]) == 2


# -- series (pure) ----------------------------------------------------------------------------


def test_quantile_interpolates_inside_buckets() -> None:
    buckets = {0.001: 50, 0.01: 40, 0.1: 9, math.inf: 1}
    assert quantile(0.5, buckets) == pytest.approx(0.001)
    assert quantile(0.9, buckets) == pytest.approx(0.01)
    assert quantile(0.95, buckets) == pytest.approx(0.01 + 0.09 * 5 / 9)
    assert quantile(1.0, buckets) == 0.1  # the open bucket reports its lower bound
    assert quantile(0.5, {0.001: 0}) is None


def test_bins_use_deltas_and_survive_counter_resets() -> None:
    samples = [
        Sample(0.0, 100, 90, {0.01: 100}),
        Sample(30.0, 160, 150, {0.01: 150, 0.1: 10}),
        Sample(60.0, 10, 10, {0.01: 10}),  # counters reset (keys deleted)
    ]
    bins = bins_of(samples, now=61.0, window_s=60, bin_s=30)
    assert [b.delivered for b in bins] == [60, 10]
    assert bins[0].per_minute(bins[0].delivered) == pytest.approx(120.0)
    assert bins_of(samples[:1], now=61.0, window_s=60, bin_s=30)[0].per_minute(0) is None
    assert bins[1].lateness == {0.01: 10}
    assert bins[0].lateness == {0.01: 50, 0.1: 10}


def test_health_needs_overdue_and_an_idle_consumer() -> None:
    now = datetime.now(UTC)
    base = Stats("q", 0, 1, 0, 0, 1, 5.0, None)
    history = History()
    assert health(Stats("q", 0, 0, 0, 0, 0, 0.0, None), now, history) == "ok"
    assert health(base, now, history) == "stuck"  # no consumer ever
    seen = Stats("q", 0, 1, 0, 0, 1, 5.0, None, consumer_seen_at=now - timedelta(seconds=2))
    assert health(seen, now, history) == "late"
    history.add("q", Sample(0.0, 5, 5, {}))
    history.add("q", Sample(40.0, 5, 5, {}))  # nothing delivered for 40 s
    assert health(seen, now, history) == "stuck"


async def test_a_paused_queue_and_its_limits_are_shown(queues: Any, dash: Any) -> None:
    from delayq import Limit, Offer

    q = queues("held")
    await q.limits.set("tenant<1>", Limit(concurrency=1))
    await q.offer_many([Offer(i, 0, limit_key="tenant<1>") for i in range(3)])
    assert len(await q.poll_many(10, timeout=2)) == 1
    await q.pause(until=timedelta(minutes=5))
    client, _ = dash()
    index = (await client.get("/")).text
    assert 'class="paused" data-queue="held"' in index and "1 paused" in index
    page = (await client.get("/q/held")).text
    assert 'id="paused"' in page and "until resumed" not in page
    assert "2 task(s) waiting, 1 lease(s) running" in page
    assert "tenant&lt;1&gt; (2)" in page  # escaped, as all Redis data
    await q.resume()
    assert 'id="paused"' not in (await client.get("/q/held")).text

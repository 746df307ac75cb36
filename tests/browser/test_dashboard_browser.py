"""The dashboard in a real headless Chromium (Playwright), served by uvicorn on a free port,
against the test's own redis-server and real tasks. Waits on selectors, never on sleeps."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from delayq import DelayQueue
from delayq.dashboard import Settings
from delayq.embedded import EmbeddedRedis

from ..helpers import wait_until
from .support import running, serving_page

FIELDS = ("delayed", "ready", "inflight", "dead", "overdue")


@pytest.fixture
def queues(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[Callable[..., DelayQueue]]:
    made: list[DelayQueue] = []

    def make(name: str) -> DelayQueue:
        q = DelayQueue(name, redis7_server.url, prefix=prefix)
        made.append(q)
        return q

    yield make
    for q in made:
        q.close()


@pytest.fixture
def dashboard(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[Callable[..., Any]]:
    """Start a dashboard on the test's prefix; stopped after the test."""
    stack: list[Any] = []

    def start(**options: Any) -> str:
        cm = running(Settings(redis_url=redis7_server.url, prefix=prefix, **options))
        stack.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(stack):
        cm.__exit__(None, None, None)


def seed(q: DelayQueue, delayed: int, ready: int, inflight: int, dead: int) -> None:
    for i in range(delayed):
        q.offer({"d": i}, delay=600 + i)
    for i in range(inflight + dead):
        q.offer({"x": i}, at=time.time() - 5)
    for i, task in enumerate(q.poll_many(inflight + dead) if inflight + dead else []):
        if i < dead:
            q.reject(task, "card declined")
    for i in range(ready):
        q.offer({"r": i}, at=time.time() - 5)


def test_main_page_shows_the_counts_of_stats(page: Any, queues: Any, dashboard: Any) -> None:
    orders, mails = queues("orders"), queues("emails")
    seed(orders, delayed=4, ready=3, inflight=2, dead=1)
    seed(mails, delayed=9, ready=0, inflight=0, dead=2)
    page.goto(dashboard())
    page.wait_for_selector("tr[data-queue='orders']")
    for q in (orders, mails):
        st = q.stats()
        row = page.locator(f"tr[data-queue='{q.name}']")
        shown = {f: int(row.locator(f"[data-field='{f}']").inner_text()) for f in FIELDS}
        assert shown == {f: getattr(st, f) for f in FIELDS}
    assert "late" in (page.locator("tr[data-queue='orders']").get_attribute("class") or "")
    assert page.locator("#totals [data-field='delayed']").inner_text() == "13"


def test_cancel_through_the_confirmation(page: Any, queues: Any, dashboard: Any) -> None:
    q = queues("orders")
    keep = q.offer({"order": 1}, delay=600)
    victim = q.offer({"order": 2}, delay=900)
    base = dashboard()
    page.goto(f"{base}/q/orders?state=delayed")
    page.click(f"a[href$='id={victim}']")
    page.wait_for_selector("#payload")
    page.click("a.button.danger:has-text('cancel')")
    page.wait_for_selector("form#confirm")
    assert page.url.startswith(f"{base}/q/orders/confirm")
    assert q.get(victim) is not None  # nothing happens before the confirmation
    page.click("form#confirm button[type=submit]")
    page.wait_for_selector("#done")
    assert page.inner_text("#done") == f"Task {victim} cancelled."
    assert q.get(victim) is None and q.get(keep) is not None
    page.click("nav.crumbs a:has-text('orders')")
    assert page.inner_text("#counts [data-field='delayed']") == "1"


def test_requeue_all_dead_through_the_confirmation(page: Any, queues: Any, dashboard: Any) -> None:
    q = queues("payments")
    seed(q, delayed=0, ready=0, inflight=0, dead=3)
    page.goto(f"{dashboard()}/q/payments?state=dead")
    assert page.locator("#tasks tbody tr").count() == 3
    assert page.locator("#tasks").inner_text().count("card declined") == 3
    page.click("text=requeue all dead")
    page.wait_for_selector("text=holds 3 dead task(s)")
    page.click("form#confirm button[type=submit]")
    page.wait_for_selector("#done")
    assert page.inner_text("#done") == "3 dead task(s) requeued."
    assert page.inner_text("#counts [data-field='dead']") == "0"
    assert page.inner_text("#counts [data-field='ready']") == "3"
    st = q.stats()
    assert st.dead == 0 and st.ready == 3


def test_script_payload_stays_text(page: Any, queues: Any, dashboard: Any) -> None:
    q = queues("evil")
    script = "<script>window.__xss = 1; alert('xss')</script>"
    image = "<img src=x onerror=window.__xss=2;alert(2)>"
    task_id = q.offer({"note": script, "img": image}, delay=600, headers={"h": script})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(f"{dashboard()}/q/evil/task?id={task_id}")
    text = page.inner_text("#payload")
    assert script in text and image in text
    page.goto(f"{page.url.split('/q/')[0]}/q/evil?state=delayed")
    assert "<script>window.__xss" in page.inner_text("#tasks")
    assert dialogs == [] and page.evaluate("window.__xss") is None
    assert page.locator("img[src=x]").count() == 0


def test_token_is_enforced(page: Any, browser: Any, queues: Any, dashboard: Any) -> None:
    seed(queues("orders"), delayed=2, ready=0, inflight=0, dead=0)
    base = dashboard(token="correct horse battery staple")
    page.goto(f"{base}/q/orders")
    page.wait_for_selector("form#login")
    assert "/login" in page.url and page.locator("#counts").count() == 0
    page.fill("input[name=token]", "wrong")
    page.click("form#login button")
    assert page.inner_text("#login-error") == "Wrong token."
    page.fill("input[name=token]", "correct horse battery staple")
    page.click("form#login button")
    page.wait_for_selector("#counts")
    assert page.url == f"{base}/q/orders"
    assert page.inner_text("#counts [data-field='delayed']") == "2"
    # Another browser (no cookie) is sent to the login page again.
    other = browser.new_context()
    try:
        fresh = other.new_page()
        fresh.goto(base)
        fresh.wait_for_selector("form#login")
    finally:
        other.close()


def test_auto_refresh_shows_new_counts(page: Any, queues: Any, dashboard: Any) -> None:
    q = queues("live")
    q.offer({"x": 0}, delay=600)
    page.goto(dashboard(refresh_s=0.3))
    cell = "tr[data-queue='live'] [data-field='delayed']"
    assert page.inner_text(cell) == "1"
    q.offer({"x": 1}, delay=600)
    wait_until(lambda: page.inner_text(cell) == "2", timeout=10)


ATTACK = """<!doctype html><html><body>
<script>document.cookie = "delayq_csrf=COOKIE; path=/";</script>
<form id="attack" method="post" action="DASHBOARD/q/payments/action">
<input name="csrf" value="TOKEN"><input name="action" value="purge_dead"></form>
<script>document.getElementById("attack").submit();</script>
</body></html>"""


def test_a_page_on_another_port_cannot_act(
    page: Any, browser: Any, queues: Any, dashboard: Any
) -> None:
    """A page served on another port of 127.0.0.1 plants a CSRF cookie (cookies ignore ports,
    so the dashboard receives it) and posts the purge form with the matching token. Both
    cases: a cookie it invented, and a real pair it fetched from the dashboard itself (any
    local process can). Chromium says where the form came from; the dashboard refuses."""
    q = queues("payments")
    seed(q, delayed=0, ready=0, inflight=0, dead=2)
    base = dashboard()
    confirm = httpx.get(f"{base}/q/payments/confirm?action=purge_dead")
    token = re.search(r'name="csrf" value="([^"]+)"', confirm.text)
    assert token is not None
    fetched = (confirm.cookies["delayq_csrf"], token.group(1))
    for cookie, csrf in (("A" * 43, "A" * 43), fetched):
        html = ATTACK.replace("COOKIE", cookie).replace("TOKEN", csrf)
        victim = browser.new_context()  # a browser that has not seen the dashboard yet
        try:
            tab = victim.new_page()
            with serving_page(html.replace("DASHBOARD", base)) as attacker:
                assert attacker.split(":")[2] != base.split(":")[2]  # same host, another port
                tab.goto(attacker)
                tab.wait_for_url(re.compile(re.escape(base) + "/"))  # the form's answer
                tab.wait_for_load_state()
                assert tab.url == f"{base}/q/payments/action"  # not redirected: refused
                assert tab.inner_text("#error-title") == "Forbidden"
                assert "Cross-origin request refused" in tab.inner_text("#error-detail")
        finally:
            victim.close()
        assert q.stats().dead == 2
    # The dashboard's own page, in the same browser, still can.
    page.goto(f"{base}/q/payments/confirm?action=purge_dead")
    page.click("form#confirm button[type=submit]")
    page.wait_for_selector("#done")
    assert page.inner_text("#done") == "2 dead task(s) purged."
    assert q.stats().dead == 0

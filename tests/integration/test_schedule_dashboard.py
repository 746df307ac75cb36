"""The dashboard's schedules page (``/q/{name}/schedules``), read only, against real Redis."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from delayq import AsyncDelayQueue
from delayq.dashboard import Settings, create_app
from delayq.embedded import EmbeddedRedis


@pytest.fixture
async def client(redis7_server: EmbeddedRedis, prefix: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(prefix=prefix, redis_url=redis7_server.url))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        yield c
    await app.state.dashboard.monitor.close()


async def test_schedules_page_lists_each_schedule(
    redis7_server: EmbeddedRedis, prefix: str, client: httpx.AsyncClient
) -> None:
    async with AsyncDelayQueue("jobs", redis7_server.url, prefix=prefix) as q:
        await q.schedules.upsert("nightly", "n", cron="30 2 * * *", tz="Europe/London")
        await q.schedules.upsert("beat", "b", every=60)
        await q.schedules.pause("beat", note="<b>deploy</b>")
        await q.offer("plain")
        async with AsyncDelayQueue("empty", redis7_server.url, prefix=prefix) as other:
            await other.offer("x")
            page = await client.get("/q/jobs/schedules")
            assert page.status_code == 200
            rows = re.findall(r'<tr data-schedule="([^"]+)">', page.text)
            assert rows == ["beat", "nightly"]
            assert "At 02:30 every day (Europe/London)" in page.text
            assert "paused (&lt;b&gt;deploy&lt;/b&gt;)" in page.text, "notes are escaped"
            assert 'href="/q/jobs/schedules"' in (await client.get("/q/jobs")).text
            none = await client.get("/q/empty/schedules")
            assert none.status_code == 200 and "no recurring schedules" in none.text
            assert (await client.get("/q/missing/schedules")).status_code == 404


async def test_schedules_page_shows_payloads_and_marks_undecodable_ones(
    redis7_server: EmbeddedRedis, prefix: str, client: httpx.AsyncClient
) -> None:
    """The page reads with the JSON codec: a msgpack payload shows, a pickled one is marked
    invalid (the dashboard never unpickles), and the page still answers."""
    url = redis7_server.url
    async with AsyncDelayQueue("mp", url, prefix=prefix, codec="msgpack") as packed:
        await packed.schedules.upsert("raw", {"n": 7, "blob": b"\x00"}, every=60)
        await packed.schedules.upsert("text", "<b>plain</b>", every=60)
    async with AsyncDelayQueue("pk", url, prefix=prefix, codec="pickle") as pickled:
        await pickled.schedules.upsert("set", {1, 2}, every=60)
    shown = await client.get("/q/mp/schedules")
    assert shown.status_code == 200
    payload = re.search(r'<td data-field="payload"><code>([^<]*)</code>', shown.text)
    assert payload is not None and "&#34;n&#34;: 7" in payload.group(1), shown.text
    assert "&lt;b&gt;plain&lt;/b&gt;" in shown.text, "payloads are escaped"
    marked = await client.get("/q/pk/schedules")
    assert marked.status_code == 200
    assert re.search(r'<span class="invalid" title="[^"]*pickled[^"]*">invalid: ', marked.text)

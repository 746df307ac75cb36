"""The dashboard on a cluster URL: queues on every node and a sharded queue shown as one,
read through the connection layer (one round per node)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from delayq import DelayQueue
from delayq.dashboard import Settings, create_app
from delayq.embedded import EmbeddedCluster

from ..conftest import BINARIES

NAMES = ["orders", "stock", "mail", "receipts", "reminders"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


async def test_index_and_queue_pages_on_a_cluster_url(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
    for name in NAMES:
        with DelayQueue(name, url, prefix=prefix) as q:
            q.offer(name, delay=60)
    with DelayQueue("promo", url, prefix=prefix, shards=8) as q:
        q.offer_many([(n, 60) for n in range(40)])
    app = create_app(Settings(redis_url=url, prefix=prefix))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
    try:
        index = await client.get("/")
        assert index.status_code == 200, index.text
        for name in [*NAMES, "promo"]:
            assert f'data-queue="{name}"' in index.text
        row = index.text[index.text.index('data-queue="promo"') :]
        row = row[: row.index("</tr>")]
        assert re.search(r'data-field="delayed">40<', row), row
        page = await client.get("/q/promo")
        assert page.status_code == 200 and 'id="shards"' in page.text
        shards = re.findall(r'<tr data-shard="\d+">.*?data-field="delayed">(\d+)<', page.text)
        assert len(shards) == 8 and sum(map(int, shards)) == 40
    finally:
        await client.aclose()
        await app.state.dashboard.monitor.close()

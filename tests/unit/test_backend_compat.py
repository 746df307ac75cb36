"""The connection layer's use of redis-py internals that changed between the versions delayq
supports (redis>=5.0): the bench's virtualenv runs redis-py 5.3, the tests' 8.x."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import ClusterNode

from delayq._async import backend


class _NodeOfRedisPy5(ClusterNode):
    """redis-py 5.x's asyncio ClusterNode: no release(); its own calls append a connection
    to the free deque when done with it."""

    release = None  # type: ignore[assignment]


class _Client:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    def get_node(self, host: str, port: int) -> Any:
        return self.node if (host, port) == (self.node.host, self.node.port) else None


async def test_a_checked_in_connection_is_reused_without_release() -> None:
    node = _NodeOfRedisPy5("127.0.0.1", 7000)
    conn = node.acquire_connection()
    await backend.node_checkin(_Client(node), ("127.0.0.1", 7000), conn)
    assert node.acquire_connection() is conn


async def test_a_checked_in_connection_is_released_where_release_exists() -> None:
    node = ClusterNode("127.0.0.1", 7000)
    conn = node.acquire_connection()
    await backend.node_checkin(_Client(node), ("127.0.0.1", 7000), conn)
    assert node.acquire_connection() is conn

"""The Redis a fault-scenario process talks to, named on its command line.

``TARGET`` is one of:

``sentinel:HOST:PORT[,HOST:PORT...]/SERVICE``
    a redis-py Sentinel ``master_for(SERVICE)`` client (sync or asyncio);
``cluster:HOST:PORT[,HOST:PORT...]``
    a redis-py ``RedisCluster`` over those startup nodes;
anything else
    a URL handed to delayq as it is (``redis://``, and the ``redis+sentinel://`` and
    ``redis+cluster://`` forms once delayq accepts them).
"""

from __future__ import annotations

from typing import Any

# Short socket timeouts: a SIGSTOPped master must not hold a call for redis-py's default
# (no timeout at all); delayq's own retries decide how long to keep trying.
SOCKET_TIMEOUT_S = 2.0


def _addresses(spec: str) -> list[tuple[str, int]]:
    pairs = []
    for item in spec.split(","):
        host, _, port = item.rpartition(":")
        pairs.append((host, int(port)))
    return pairs


def make_client(target: str, *, asyncio: bool = False) -> Any:
    """A client (or URL) for ``target``, as delayq's ``redis=`` argument takes it."""
    kind, _, rest = target.partition(":")
    if kind == "sentinel":
        hosts, _, service = rest.partition("/")
        if asyncio:
            from redis.asyncio.sentinel import Sentinel as AsyncSentinel

            return AsyncSentinel(
                _addresses(hosts), sentinel_kwargs={"socket_timeout": 1.0}
            ).master_for(service, socket_timeout=SOCKET_TIMEOUT_S)
        from redis.sentinel import Sentinel

        return Sentinel(_addresses(hosts), sentinel_kwargs={"socket_timeout": 1.0}).master_for(
            service, socket_timeout=SOCKET_TIMEOUT_S
        )
    if kind == "cluster":
        nodes = _addresses(rest)
        if asyncio:
            from redis.asyncio.cluster import ClusterNode as AsyncNode
            from redis.asyncio.cluster import RedisCluster as AsyncCluster

            return AsyncCluster(
                startup_nodes=[AsyncNode(h, p) for h, p in nodes],
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=1.0,
            )
        from redis.cluster import ClusterNode, RedisCluster

        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in nodes],
            socket_timeout=SOCKET_TIMEOUT_S,
            socket_connect_timeout=1.0,
        )
    return target


def close_client(client: Any) -> None:
    if not isinstance(client, str):
        client.close()

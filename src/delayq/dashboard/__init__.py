"""A web dashboard for delayq queues: ``delayq dashboard`` (extra ``delayq[dashboard]``).

Server-rendered pages (Starlette + Jinja2, charts as inline SVG): every queue's counts, an
hour of throughput and lateness kept in the dashboard's memory, tasks by state, and the
actions of the CLI (cancel, run now, reschedule, requeue, purge) behind a confirmation step.
See docs/dashboard.md.
"""

from __future__ import annotations

import dataclasses
import logging
import socket

from .._core.errors_text import bind_error
from .app import Settings, create_app
from .security import check_bind, is_wildcard


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    forwarded_allow_ips: str | None = None,
) -> None:
    """Run the dashboard with uvicorn until interrupted. Refuses a non-loopback ``host``
    without a token, and a wildcard one without ``settings.allowed_hosts`` (raises
    :class:`~delayq.ConfigError`). A specific address ``host`` is served as a Host name too.

    ``forwarded_allow_ips`` (as uvicorn's option: addresses of trusted proxies, comma
    separated) makes uvicorn believe their ``X-Forwarded-Proto``/``-For`` headers: cookies are
    then ``Secure`` behind a TLS proxy, and back-off counts per real client. Off by default: a
    client could otherwise claim to be anyone."""
    import uvicorn

    check_bind(host, settings.token, settings.allowed_hosts)
    # The address bound is a name clients use (IPv6 literals cannot be matched: skipped).
    if not is_wildcard(host) and ":" not in host and host not in settings.allowed_hosts:
        settings = dataclasses.replace(settings, allowed_hosts=(*settings.allowed_hosts, host))
    config = uvicorn.Config(
        create_app(settings), host=host, port=port, log_level="info",
        proxy_headers=bool(forwarded_allow_ips), forwarded_allow_ips=forwarded_allow_ips,
    )  # fmt: skip
    # Bound here, not by uvicorn, whose refusal is a log line without the reason's address
    # and an exit; ours is an OSError naming it (the CLI's one error line).
    sock = listening_socket(host, port)
    bound = sock.getsockname()[1]
    where = f"[{host.strip('[]')}]" if ":" in host else host
    # uvicorn prints its own line only for a socket it binds: the same line, for the same logs.
    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", where, bound
    )
    uvicorn.Server(config).run(sockets=[sock])


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (IPv6 for an address with a colon)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise bind_error(host, port, exc) from exc
    return sock


__all__ = ["Settings", "create_app", "serve"]

"""A web dashboard for delayq queues: ``delayq dashboard`` (extra ``delayq[dashboard]``).

Server-rendered pages (Starlette + Jinja2, charts as inline SVG): every queue's counts, an
hour of throughput and lateness kept in the dashboard's memory, tasks by state, and the
actions of the CLI (cancel, run now, reschedule, requeue, purge) behind a confirmation step.
See docs/dashboard.md.
"""

from __future__ import annotations

import dataclasses

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
    uvicorn.run(
        create_app(settings), host=host, port=port, log_level="info",
        proxy_headers=bool(forwarded_allow_ips), forwarded_allow_ips=forwarded_allow_ips,
    )  # fmt: skip


__all__ = ["Settings", "create_app", "serve"]

"""A web dashboard for delayq queues: ``delayq dashboard`` (extra ``delayq[dashboard]``).

Server-rendered pages (Starlette + Jinja2, charts as inline SVG): every queue's counts, an
hour of throughput and lateness kept in the dashboard's memory, tasks by state, and the
actions of the CLI (cancel, run now, reschedule, requeue, purge) behind a confirmation step.
See docs/dashboard.md.
"""

from __future__ import annotations

from .app import Settings, create_app
from .security import check_bind


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Run the dashboard with uvicorn until interrupted. Refuses a non-loopback ``host``
    without a token (raises :class:`~delayq.ConfigError`)."""
    import uvicorn

    check_bind(host, settings.token)
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", proxy_headers=False)


__all__ = ["Settings", "create_app", "serve"]

"""The Starlette application: the routes, the middleware, the sampler and the error pages.

The endpoints are functions of the request (:mod:`.endpoints`); what they share is one
:class:`~.state.Dashboard`, built here and kept on ``app.state.dashboard``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..exceptions import RedisUnavailable, ServerError
from . import endpoints, security
from .guard import Guard
from .state import HERE, Dashboard, Settings

__all__ = ["Dashboard", "Settings", "create_app"]


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """Run the sampler behind the charts while the app serves; close Redis after."""
    board: Dashboard = app.state.dashboard
    sampler = asyncio.create_task(board.run_sampler(), name="delayq-dashboard-sampler")
    try:
        yield
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await board.monitor.close()


def create_app(settings: Settings | None = None) -> Starlette:
    """The dashboard as an ASGI app (serve it with uvicorn, or ``delayq dashboard``)."""
    board = Dashboard(settings or Settings())
    routes = [
        Route("/", endpoints.index),
        Route("/q/{name}", endpoints.queue_page),
        Route("/q/{name}/task", endpoints.task_page),
        Route("/q/{name}/schedules", endpoints.schedules_page),
        Route("/q/{name}/confirm", endpoints.confirm),
        Route("/q/{name}/action", endpoints.act, methods=["POST"]),
        Route("/login", endpoints.login, methods=["GET", "POST"]),
        Route("/logout", endpoints.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    guard = Guard(
        board.settings.token, board.sessions, board.signer, board.throttle, endpoints.problem
    )
    middleware = [
        Middleware(
            TrustedHostMiddleware,
            allowed_hosts=security.host_allow_list(board.settings.allowed_hosts),
        ),
        Middleware(BaseHTTPMiddleware, dispatch=guard),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            HTTPException: endpoints.http_error,
            RedisUnavailable: endpoints.redis_down,
            ServerError: endpoints.redis_down,
            RedisError: endpoints.redis_down,
            OSError: endpoints.redis_down,
        },
        lifespan=lifespan,
    )
    app.state.dashboard = board
    return app

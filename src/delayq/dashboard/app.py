"""The Starlette application: pages, actions, the sampler and the error pages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from .. import TaskState
from .._core.keys import validate_name
from .._core.urls import safe_url
from ..exceptions import ConfigError, InvalidTaskError, RedisUnavailable, ServerError
from . import charts, security, views
from .monitor import Monitor
from .series import History, health, sample_of

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``delayq dashboard`` can be told."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "dq"
    token: str | None = None
    read_only: bool = False
    sample_interval_s: float = 5.0  # how often the sampler records every queue's stats
    window_s: float = 3600.0  # history kept for the charts (in memory)
    bin_s: float = 60.0  # one chart point per bin
    refresh_s: float = 5.0  # the pages reload their figures this often (0: never)
    redis_timeout_s: float = 2.0
    # Host headers served; None: loopback names only when there is no token. Without it, a web
    # page could rebind its own name to 127.0.0.1 (DNS rebinding), then read this dashboard and
    # post its forms as same-origin.
    allowed_hosts: tuple[str, ...] | None = None


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class Dashboard:
    """The state behind the app: the Redis monitor and the in-memory history."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.monitor = Monitor(
            settings.redis_url, settings.prefix, timeout=settings.redis_timeout_s
        )
        self.history = History(settings.window_s, settings.sample_interval_s)
        self.sampler_error: str | None = None

    async def sample_once(self) -> None:
        """Record one sample of every registered queue."""
        snapshot = await self.monitor.snapshot()
        t = time.time()
        for stats in snapshot.stats:
            self.history.add(stats.queue, sample_of(stats, t))
        self.history.keep_only(s.queue for s in snapshot.stats)

    async def run_sampler(self) -> None:
        while True:
            try:
                await self.sample_once()
                self.sampler_error = None
            except Exception as exc:  # keep sampling through outages; the pages say so
                self.sampler_error = f"{type(exc).__name__}: {exc}"
                log.warning("dashboard: sampling failed: %s", exc)
            await asyncio.sleep(self.settings.sample_interval_s)


def create_app(settings: Settings | None = None) -> Starlette:
    """The dashboard as an ASGI app (serve it with uvicorn, or ``delayq dashboard``)."""
    settings = settings or Settings()
    board = Dashboard(settings)
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters.update(
        duration=views.duration, iso=views.iso, pretty=views.pretty,
        preview=views.preview, q=views.quote_all, relative=views.relative,
    )  # fmt: skip
    templates = Jinja2Templates(env=env)

    def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
        context.update(
            csrf=request.state.csrf,
            settings=settings,
            read_only=settings.read_only,
            sampler_error=board.sampler_error,
        )
        return templates.TemplateResponse(request, template, context, status_code=status)

    def problem(request: Request, status: int, title: str, detail: str) -> Response:
        return render(request, "error.html", status, title=title, detail=detail)

    async def guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Any:
        token, fresh = security.csrf_token(request)
        request.state.csrf = token
        path = request.url.path
        public = path == "/login" or path.startswith("/static/")
        if public or security.authorized(request, settings.token):
            response = await call_next(request)
        elif request.method in ("GET", "HEAD") and "authorization" not in request.headers:
            target = quote(path + (f"?{request.url.query}" if request.url.query else ""))
            response = RedirectResponse(f"/login?next={target}", 303)
        else:
            response = problem(request, 401, "Not signed in", "This dashboard needs its token.")
        if fresh:
            response.set_cookie(
                security.CSRF_COOKIE, token, httponly=True, samesite="strict",
                secure=request.url.scheme == "https", path="/",
            )  # fmt: skip
        response.headers.update(
            {
                "content-security-policy": "default-src 'self'; frame-ancestors 'none'; "
                "form-action 'self'; base-uri 'none'",
                "x-content-type-options": "nosniff",
                "referrer-policy": "no-referrer",
                "cache-control": "no-store",
            }
        )
        return response

    async def checked_form(request: Request) -> dict[str, str]:
        """The posted form, after the CSRF check."""
        form = await request.form()
        if not security.csrf_ok(request, form.get(security.CSRF_FIELD)):
            raise HTTPException(403, "CSRF check failed: reload the page and try again.")
        return {k: v for k, v in form.items() if isinstance(v, str)}

    def queue_name(request: Request) -> str:
        try:
            return validate_name(request.path_params["name"])
        except ConfigError as exc:
            raise HTTPException(404, str(exc)) from exc

    async def index(request: Request) -> Response:
        snap = await board.monitor.snapshot()
        rows = [(s, health(s, snap.server_now, board.history)) for s in snap.stats]
        fields = ("delayed", "ready", "inflight", "dead", "overdue")
        totals = {f: sum(getattr(s, f) for s in snap.stats) for f in fields}
        bins = board.history.total_bins(time.time(), settings.bin_s)
        return render(
            request, "index.html", rows=rows, totals=totals, now=snap.server_now,
            stuck=sum(1 for _, h in rows if h == "stuck"), **chart_context(bins),
        )  # fmt: skip

    def chart_context(bins: Any) -> dict[str, Any]:
        minutes = settings.window_s / 60
        since = board.history.since()
        return {
            "throughput": charts.throughput_chart(bins, minutes),
            "lateness": charts.lateness_chart(bins, minutes),
            "history_s": None if since is None else time.time() - since,
        }

    async def queue_page(request: Request) -> Response:
        name = queue_name(request)
        state = request.query_params.get("state", "ready")
        if state not in {s.value for s in TaskState}:
            raise HTTPException(404, f"no such state {state!r}")
        try:
            page = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            page = 1
        q = board.monitor.queue(name)
        snap, tasks = await asyncio.gather(
            board.monitor.snapshot([name]), q.tasks(state, PAGE_SIZE, (page - 1) * PAGE_SIZE)
        )
        stats = snap.stats[0]
        pages = max(1, math.ceil(getattr(stats, state) / PAGE_SIZE))
        bins = board.history.bins(name, time.time(), settings.bin_s)
        return render(
            request, "queue.html", name=name, stats=stats, state=state, tasks=tasks,
            page=page, pages=pages, now=snap.server_now,
            health=health(stats, snap.server_now, board.history),
            done=done_message(request), **chart_context(bins),
        )  # fmt: skip

    def done_message(request: Request) -> str | None:
        template = views.DONE.get(request.query_params.get("done", ""))
        if template is None:
            return None
        params = request.query_params
        return template.format(id=params.get("id", "?"), n=params.get("n", "?"))

    async def task_page(request: Request) -> Response:
        name = queue_name(request)
        task_id = request.query_params.get("id", "")
        try:
            info, now = await asyncio.gather(
                board.monitor.queue(name).get(task_id), board.monitor.server_now()
            )
        except InvalidTaskError as exc:
            raise HTTPException(404, str(exc)) from exc
        if info is None and not request.query_params.get("done"):
            raise HTTPException(404, f"queue {name} has no task {task_id!r}")
        return render(
            request, "task.html", name=name, task_id=task_id, info=info, now=now,
            done=done_message(request),
        )  # fmt: skip

    async def confirm(request: Request) -> Response:
        name = queue_name(request)
        action = views.ACTIONS.get(request.query_params.get("action", ""))
        if action is None:
            raise HTTPException(404, "unknown action")
        if settings.read_only:
            raise HTTPException(403, "This dashboard is read-only.")
        q = board.monitor.queue(name)
        task_id = request.query_params.get("id", "")
        info = None
        if action.task:
            try:
                info = await q.get(task_id)
            except InvalidTaskError as exc:
                raise HTTPException(404, str(exc)) from exc
        stats = (await board.monitor.snapshot([name])).stats[0]
        return render(
            request, "confirm.html", name=name, action=action, task_id=task_id, info=info,
            stats=stats,
        )  # fmt: skip

    async def act(request: Request) -> Response:
        name = queue_name(request)
        if settings.read_only:
            raise HTTPException(403, "This dashboard is read-only.")
        form = await checked_form(request)
        action = views.ACTIONS.get(form.get("action", ""))
        if action is None:
            raise HTTPException(400, "unknown action")
        task_id = form.get("id", "")
        delay = 0.0
        if action.name == "reschedule":
            try:
                delay = views.parse_delay(form.get("delay", ""))
            except ValueError as exc:
                raise HTTPException(400, str(exc)) from exc
        try:
            outcome = await views.perform(board.monitor.queue(name), action, task_id, delay)
        except InvalidTaskError as exc:
            raise HTTPException(400, str(exc)) from exc
        if action.task:
            return RedirectResponse(f"/q/{name}/task?{outcome}", 303)
        return RedirectResponse(f"/q/{name}?state=dead&{outcome}", 303)

    async def login(request: Request) -> Response:
        if not settings.token:
            return RedirectResponse("/", 303)
        nxt = security.safe_next(request.query_params.get("next"))
        if request.method == "GET":
            return render(request, "login.html", next=nxt, error=None)
        form = await checked_form(request)
        nxt = security.safe_next(form.get("next"))
        if not security.token_matches(form.get("token", ""), settings.token):
            return render(request, "login.html", 401, next=nxt, error="Wrong token.")
        response = RedirectResponse(nxt, 303)
        response.set_cookie(
            security.AUTH_COOKIE, security.session_value(settings.token), httponly=True,
            samesite="strict", secure=request.url.scheme == "https", path="/",
        )  # fmt: skip
        return response

    async def logout(request: Request) -> Response:
        await checked_form(request)
        response = RedirectResponse("/login" if settings.token else "/", 303)
        response.delete_cookie(security.AUTH_COOKIE, path="/")
        return response

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        titles = {400: "Bad request", 403: "Forbidden", 404: "Not found"}
        return problem(request, exc.status_code, titles.get(exc.status_code, "Error"), exc.detail)

    async def redis_down(request: Request, exc: Exception) -> Response:
        log.warning("dashboard: Redis unavailable: %s", exc)
        return problem(
            request, 503, "Redis is unavailable",
            f"The dashboard cannot reach Redis at {safe_url(settings.redis_url)}: {exc}",
        )  # fmt: skip

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.create_task(board.run_sampler(), name="delayq-dashboard-sampler")
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await board.monitor.close()

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/q/{name}", queue_page),
            Route("/q/{name}/task", task_page),
            Route("/q/{name}/confirm", confirm),
            Route("/q/{name}/action", act, methods=["POST"]),
            Route("/login", login, methods=["GET", "POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[
            *_host_check(settings),
            Middleware(BaseHTTPMiddleware, dispatch=guard),
        ],
        exception_handlers={
            HTTPException: http_error,
            RedisUnavailable: redis_down,
            ServerError: redis_down,
            RedisError: redis_down,
            OSError: redis_down,
        },
        lifespan=lifespan,
    )
    app.state.dashboard = board
    return app


def _host_check(settings: Settings) -> list[Middleware]:
    hosts = settings.allowed_hosts
    if hosts is None and not settings.token:
        hosts = LOOPBACK_NAMES
    return [Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))] if hosts else []

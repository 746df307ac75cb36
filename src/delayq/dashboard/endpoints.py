"""The dashboard's endpoints and error pages, as Starlette functions of the request.

What they need is the app's :class:`~.state.Dashboard`, on ``request.app.state.dashboard``
(:func:`dashboard_of`); who is asking is ``request.state.caller``, as the guard found out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .._core.keys import validate_name
from .._core.models import HELD_STATES
from .._core.urls import safe_url
from ..exceptions import ConfigError, InvalidTaskError
from . import charts, security, views
from .guard import Caller
from .monitor import Snapshot
from .outbox import read_outbox
from .series import HEALTH_RANK, health
from .state import Dashboard

log = logging.getLogger(__name__)
PAGE_SIZE = 50  # tasks per page of a queue
INDEX_PAGE_SIZE = 100  # queues per page of the main page
MAX_PAGE = 1_000_000


def dashboard_of(request: Request) -> Dashboard:
    """The state of the app serving ``request`` (``create_app`` keeps it on ``app.state``)."""
    board: Dashboard = request.app.state.dashboard
    return board


# -- rendering and checks shared by the endpoints ---------------------------------------------


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """``template`` with ``context`` and what every page shows (sign-in, CSRF, sampler)."""
    board = dashboard_of(request)
    caller: Caller | None = getattr(request.state, "caller", None)
    context.setdefault("csrf", caller.csrf if caller else "")
    context.update(
        signed_in=bool(caller and caller.session),
        settings=board.settings,
        read_only=board.settings.read_only,
        sampler_error=board.sampler_error,
    )
    return board.templates.TemplateResponse(request, template, context, status_code=status)


def problem(request: Request, status: int, title: str, detail: str) -> Response:
    """The error page (also the guard's, for refusals before any endpoint runs)."""
    return render(request, "error.html", status, title=title, detail=detail)


async def checked_form(request: Request, *, signing_in: bool = False) -> dict[str, str]:
    """The posted form, after the CSRF check (requests with a bearer token need none).
    The sign-in form's token is bound to the browser's CSRF cookie only (there is no
    session yet); every other form's to the session too."""
    form = await request.form()
    caller: Caller = request.state.caller
    session = None if signing_in else caller.session
    if not caller.bearer and not dashboard_of(request).signer.form_ok(
        caller.csrf_nonce, session, form.get(security.CSRF_FIELD)
    ):
        raise HTTPException(403, "CSRF check failed: reload the page and try again.")
    return {k: v for k, v in form.items() if isinstance(v, str)}


async def queue_name(request: Request) -> str:
    """The page's queue: a valid name in the registry, else 404 (nothing is kept for
    names that are not queues)."""
    try:
        name = validate_name(request.path_params["name"])
    except ConfigError as exc:
        raise HTTPException(404, str(exc)) from exc
    board = dashboard_of(request)
    if not await board.monitor.is_registered(name):
        raise HTTPException(
            404, f"no queue {name!r} under prefix {board.settings.prefix!r} (a queue registers "
            "on its first offer)",
        )  # fmt: skip
    return name


def page_number(request: Request) -> int:
    """The ``page`` asked for, from 1 to :data:`MAX_PAGE` (1 when it is not a number)."""
    raw = request.query_params.get("page", "1")
    if not (raw.isascii() and raw.isdigit()):
        return 1
    if len(raw) > 7:  # past any last page (and int() of 10,000 digits costs time)
        return MAX_PAGE
    return min(MAX_PAGE, max(1, int(raw)))


def chart_context(board: Dashboard, bins: Any, since: float | None) -> dict[str, Any]:
    """The charts of a page and the age of the history behind them."""
    minutes = board.settings.window_s / 60
    return {
        "throughput": charts.throughput_chart(bins, minutes),
        "lateness": charts.lateness_chart(bins, minutes),
        "history_s": None if since is None else time.time() - since,
    }


def done_message(request: Request) -> str | None:
    """What the action just taken did (the redirect's ``done``, ``id`` and ``n``)."""
    template = views.DONE.get(request.query_params.get("done", ""))
    if template is None:
        return None
    params = request.query_params
    return template.format(id=views.text(params.get("id", "?"), 200), n=params.get("n", "?"))


# -- pages ------------------------------------------------------------------------------------


async def index(request: Request) -> Response:
    """``GET /``: every queue's counts and health, worst first, and the total charts."""
    board = dashboard_of(request)
    names = await board.monitor.names()
    summary, fresh, stale = await board.summary(names)
    known = {s.queue: s for s in summary.stats}
    flags = {
        n: health(known[n], summary.server_now, board.history) if n in known else "ok"
        for n in names
    }
    ordered = sorted(names, key=lambda n: (HEALTH_RANK[flags[n]], n))
    pages = max(1, math.ceil(len(ordered) / INDEX_PAGE_SIZE))
    page = min(page_number(request), pages)
    shown = ordered[(page - 1) * INDEX_PAGE_SIZE : page * INDEX_PAGE_SIZE]
    if fresh:
        snap = Snapshot(summary.server_now, [known[n] for n in shown if n in known])
    else:  # the rows on the page are read now; the summary may be a few seconds old
        snap = await board.monitor.snapshot(shown)
    rows = [(s, health(s, snap.server_now, board.history)) for s in snap.stats]
    fields = ("delayed", "ready", "inflight", "expired", "dead", "overdue")
    totals = {f: sum(getattr(s, f) for s in summary.stats) for f in fields}
    counted = {h: sum(1 for v in flags.values() if v == h) for h in HEALTH_RANK}
    bins = board.history.total_bins(time.time(), board.settings.bin_s)
    outbox = await read_outbox(board.settings, board.monitor.runner)
    response = render(
        request, "index.html", rows=rows, totals=totals, now=snap.server_now, outbox=outbox,
        queues=len(names), counted=counted, page=page, pages=pages,
        summary_age=0.0 if fresh else board.summary_age(),
        **chart_context(board, bins, board.history.since()),
    )  # fmt: skip
    if stale:  # runs once the page is sent
        response.background = BackgroundTask(board.refresh_summary)
    return response


async def queue_page(request: Request) -> Response:
    """``GET /q/{name}``: one queue's counts, charts and a page of its tasks in one state."""
    board = dashboard_of(request)
    name = await queue_name(request)
    state = request.query_params.get("state", "ready")
    if state not in {s.value for s in HELD_STATES}:
        raise HTTPException(404, f"no such state {views.text(state, 40)!r}")
    page = page_number(request)
    q = board.monitor.queue(name)
    snap = await board.monitor.snapshot([name])
    stats = snap.stats[0]
    pages = max(1, math.ceil(getattr(stats, state) / PAGE_SIZE))
    page = min(page, pages)
    unreadable = None
    try:
        tasks = await q.tasks(state, PAGE_SIZE, (page - 1) * PAGE_SIZE)
    except UnicodeDecodeError as exc:  # an id another client wrote, not UTF-8
        tasks, unreadable = [], views.text(exc, 200)
    bins = board.history.bins(name, time.time(), board.settings.bin_s)
    return render(
        request, "queue.html", name=name, stats=stats, state=state, tasks=tasks,
        page=page, pages=pages, now=snap.server_now, unreadable=unreadable,
        health=health(stats, snap.server_now, board.history),
        tracked=board.history.tracked(name), done=done_message(request),
        **chart_context(board, bins, board.history.since(name)),
    )  # fmt: skip


async def schedules_page(request: Request) -> Response:
    """``GET /q/{name}/schedules``: the queue's recurring schedules (read only)."""
    board = dashboard_of(request)
    name = await queue_name(request)
    schedules, now = await asyncio.gather(
        board.monitor.queue(name).schedules.list(upcoming=1), board.monitor.server_now()
    )
    return render(request, "schedules.html", name=name, schedules=schedules, now=now)


async def task_page(request: Request) -> Response:
    """``GET /q/{name}/task?id=``: one task, all of it."""
    board = dashboard_of(request)
    name = await queue_name(request)
    task_id = request.query_params.get("id", "")
    q = board.monitor.queue(name)
    try:
        info, events, now = await asyncio.gather(
            q.get(task_id), q.history(task_id), board.monitor.server_now()
        )
    except InvalidTaskError as exc:
        raise HTTPException(404, str(exc)) from exc
    if info is None and not events and not request.query_params.get("done"):
        raise HTTPException(404, f"queue {name} has no task {views.text(task_id, 200)!r}")
    return render(
        request, "task.html", name=name, task_id=task_id, info=info, now=now,
        done=done_message(request), events=events,
    )  # fmt: skip


# -- actions ----------------------------------------------------------------------------------


async def confirm(request: Request) -> Response:
    """``GET /q/{name}/confirm?action=``: the confirmation step before an action."""
    board = dashboard_of(request)
    name = await queue_name(request)
    action = views.ACTIONS.get(request.query_params.get("action", ""))
    if action is None:
        raise HTTPException(404, "unknown action")
    if board.settings.read_only:
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
    """``POST /q/{name}/action``: take the confirmed action, then back to the task or queue."""
    board = dashboard_of(request)
    name = await queue_name(request)
    if board.settings.read_only:
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


# -- signing in and out -----------------------------------------------------------------------


async def login(request: Request) -> Response:
    """``GET``/``POST /login``: the sign-in form (with a token set), throttled per client."""
    board = dashboard_of(request)
    token = board.settings.token
    if not token:
        return RedirectResponse("/", 303)
    nxt = security.safe_next(request.query_params.get("next"))
    caller: Caller = request.state.caller
    assert caller.csrf_nonce is not None
    csrf = board.signer.form_token(caller.csrf_nonce, None)
    if request.method == "GET":
        return render(request, "login.html", next=nxt, error=None, csrf=csrf)
    client = security.client_address(request)
    wait = board.throttle.retry_after(client)
    if wait > 0:
        seconds = max(1, round(wait))
        error = f"Too many wrong tokens from this address: try again in {seconds} s."
        response = render(request, "login.html", 429, next=nxt, error=error, csrf=csrf)
        response.headers["retry-after"] = str(seconds)
        return response
    form = await checked_form(request, signing_in=True)
    nxt = security.safe_next(form.get("next"))
    if not security.token_matches(form.get("token", ""), token):
        board.throttle.failed(client)
        return render(request, "login.html", 401, next=nxt, error="Wrong token.", csrf=csrf)
    board.throttle.succeeded(client)
    board.sessions.close(request.cookies.get(security.SESSION_COOKIE))
    response = RedirectResponse(nxt, 303)
    response.set_cookie(
        security.SESSION_COOKIE, board.sessions.open(), httponly=True,
        samesite="strict", secure=request.url.scheme == "https", path="/",
    )  # fmt: skip
    return response


async def logout(request: Request) -> Response:
    """``POST /logout``: close the session."""
    board = dashboard_of(request)
    await checked_form(request)
    board.sessions.close(request.cookies.get(security.SESSION_COOKIE))
    response = RedirectResponse("/login" if board.settings.token else "/", 303)
    response.delete_cookie(security.SESSION_COOKIE, path="/")
    return response


# -- error pages (the app's exception handlers) -----------------------------------------------


async def http_error(request: Request, exc: Exception) -> Response:
    """An :class:`HTTPException` raised by an endpoint, as the error page."""
    assert isinstance(exc, HTTPException)
    titles = {400: "Bad request", 403: "Forbidden", 404: "Not found"}
    return problem(request, exc.status_code, titles.get(exc.status_code, "Error"), exc.detail)


async def redis_down(request: Request, exc: Exception) -> Response:
    """Redis unreachable or failing: 503, with the URL's secrets masked."""
    log.warning("dashboard: Redis unavailable: %s", views.masked(exc))
    url = safe_url(dashboard_of(request).settings.redis_url)
    return problem(
        request, 503, "Redis is unavailable",
        f"The dashboard cannot reach Redis at {url}: {views.masked(exc)}",
    )  # fmt: skip

"""The middleware in front of every page: sign-in, CSRF cookie, origin check, headers.

Order of the checks (the Host allow-list runs before, in Starlette's TrustedHostMiddleware):

1. a request with a bearer token is judged by that token alone (browsers never attach one on
   their own, so it cannot be forged by another page); a client that guessed wrong too often
   is told to wait (429) before its token is even compared;
2. otherwise a signed-in browser is one with a live session id issued by :class:`Sessions`;
3. every POST not made with a bearer token must come from the dashboard's own origin; the
   form's CSRF token is checked by the route, once the body is read (``checked_form``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from . import security

Problem = Callable[[Request, int, str, str], Response]

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    # same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on the
    # dashboard's own POSTs, and plain-http pages get no Sec-Fetch-Site to fall back on.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


@dataclass(slots=True)
class Caller:
    """Who is asking, as the guard found out (``request.state.caller``)."""

    csrf_nonce: str | None  # of this browser's server-issued CSRF cookie
    session: str | None  # a live session id, when signed in with the form
    bearer: bool  # authorized by an Authorization header
    csrf: str = ""  # the token the page's forms carry


class Guard:
    """The dispatch function of the dashboard's ``BaseHTTPMiddleware``."""

    def __init__(
        self,
        token: str | None,
        sessions: security.Sessions,
        signer: security.CsrfSigner,
        throttle: security.SignInThrottle,
        problem: Problem,
    ) -> None:
        self.token, self.sessions, self.signer = token, sessions, signer
        self.throttle, self.problem = throttle, problem

    async def __call__(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Any:
        nonce = self.signer.nonce(request.cookies.get(security.CSRF_COOKIE))
        fresh_cookie = None
        if nonce is None:
            fresh_cookie = self.signer.new_cookie()
            nonce = self.signer.nonce(fresh_cookie)
        sid = request.cookies.get(security.SESSION_COOKIE)
        caller = Caller(nonce, sid if self.token and self.sessions.valid(sid) else None, False)
        request.state.caller = caller
        response = await self._decide(request, caller, call_next)
        if fresh_cookie is not None:
            response.set_cookie(
                security.CSRF_COOKIE, fresh_cookie, httponly=True, samesite="strict",
                secure=request.url.scheme == "https", path="/",
            )  # fmt: skip
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _decide(
        self,
        request: Request,
        caller: Caller,
        call_next: Callable[[Request], Awaitable[Response]],
    ) -> Response:
        assert caller.csrf_nonce is not None
        caller.csrf = self.signer.form_token(caller.csrf_nonce, caller.session)
        given = security.bearer(request) if self.token else None
        if given is not None and self.token:
            client = security.client_address(request)
            wait = self.throttle.retry_after(client)
            if wait > 0:
                return self.too_many(request, wait)
            if not security.token_matches(given, self.token):
                self.throttle.failed(client)
                return self.problem(request, 401, "Not signed in", "Wrong token.")
            self.throttle.succeeded(client)
            caller.bearer = True
        if request.method not in ("GET", "HEAD") and not caller.bearer:
            reason = security.origin_problem(request)
            if reason is not None:
                return self.problem(
                    request, 403, "Forbidden",
                    f"Cross-origin request refused: {reason}. Actions can only be taken from "
                    "the dashboard's own pages (behind a TLS proxy: see --forwarded-allow-ips).",
                )  # fmt: skip
        path = request.url.path
        public = path == "/login" or path.startswith("/static/")
        if public or not self.token or caller.bearer or caller.session is not None:
            return await call_next(request)
        if request.method in ("GET", "HEAD"):
            target = quote(path + (f"?{request.url.query}" if request.url.query else ""))
            return RedirectResponse(f"/login?next={target}", 303)
        return self.problem(request, 401, "Not signed in", "This dashboard needs its token.")

    def too_many(self, request: Request, wait: float) -> Response:
        seconds = max(1, round(wait))
        response = self.problem(
            request, 429, "Too many failed sign-ins",
            f"Too many wrong tokens from this address: try again in {seconds} s.",
        )  # fmt: skip
        response.headers["retry-after"] = str(seconds)
        return response

"""Redis URLs in messages: never show a password."""

from __future__ import annotations

import re

# userinfo: everything between "//" and the last "@" before the path. A password with an
# unencoded "/" or "@" must not leak either, so the match runs to the last "@" of the URL.
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>.*)@")
# Query options that carry secrets (redis-py reads password=; sentinels take their own).
_SECRET_OPTION = re.compile(
    r"(?P<name>(?:^|[?&;])(?:[A-Za-z_]*password|pass|pwd|token|secret)=)[^&;#]*",
    re.IGNORECASE,
)


def safe_url(url: str) -> str:
    """``url`` with its password masked, for messages, pages and logs: the password of the
    userinfo (``user:***@host``) and secret query options (``password=***``). Anything that
    does not look like a URL is returned as it is."""
    if not isinstance(url, str):
        return repr(type(url))
    masked = url
    match = _USERINFO.match(masked)
    if match:
        userinfo = match.group("userinfo")
        user, sep, _secret = userinfo.partition(":")
        shown = f"{user}:***" if sep else user
        masked = f"{match.group('scheme')}{shown}@{masked[match.end() :]}"
    return _SECRET_OPTION.sub(lambda m: f"{m.group('name')}***", masked)

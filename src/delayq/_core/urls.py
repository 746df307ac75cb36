"""URLs and connection strings in messages: never show a password.

One masker for every form delayq meets: Redis URLs (one host, or Sentinel and Cluster's
comma-separated hosts), PostgreSQL URLs and libpq's ``key=value`` connection strings, alone
(:func:`safe_url`) or anywhere in a message from us or a library (:func:`mask_secrets`).
"""

from __future__ import annotations

import re

_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
# userinfo: everything between "//" and the last "@" before the path. A password with an
# unencoded "/" or "@" must not leak either, so the match runs to the last "@" of the URL.
_USERINFO = re.compile(rf"^(?P<scheme>{_SCHEME})(?P<userinfo>.*)@")
_SECRET_NAME = r"(?:[A-Za-z_]*password|pass|pwd|token|secret)"
# Query options that carry secrets (redis-py reads password=; sentinels take their own).
_SECRET_OPTION = re.compile(rf"(?P<name>(?:^|[?&;]){_SECRET_NAME}=)[^&;#]*", re.IGNORECASE)
# libpq's key=value form: "host=db password=s3cret" or "password = 'with spaces\' too'".
# An unterminated quote runs to the end: better to mask too much than too little.
_DSN_SECRET = rf"(?P<key>(?<![\w.\-]){_SECRET_NAME}\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|[^\s']+)"
_DSN_SECRETS = re.compile(_DSN_SECRET, re.IGNORECASE)
# In free text a URL runs to the next blank: a quote or bracket may be part of a password.
_IN_TEXT = re.compile(rf"(?P<url>{_SCHEME}\S+)|{_DSN_SECRET}", re.IGNORECASE)


def safe_url(url: str) -> str:
    """``url`` with its password masked, for messages, pages and logs: the password of the
    userinfo (``user:***@host``), secret query options (``password=***``) and, in a libpq
    ``key=value`` connection string, its ``password=***``. Anything else is returned as it
    is."""
    if not isinstance(url, str):
        return repr(type(url))
    if not re.match(_SCHEME, url):
        return _DSN_SECRETS.sub(_masked_value, url)
    masked = url
    match = _USERINFO.match(masked)
    if match:
        userinfo = match.group("userinfo")
        user, sep, _secret = userinfo.partition(":")
        shown = f"{user}:***" if sep else user
        masked = f"{match.group('scheme')}{shown}@{masked[match.end() :]}"
    return _SECRET_OPTION.sub(lambda m: f"{m.group('name')}***", masked)


def mask_secrets(text: str) -> str:
    """``text`` (an error message, a log line) with every URL in it passed through
    :func:`safe_url`, and every ``password=...`` outside a URL masked."""
    return _IN_TEXT.sub(
        lambda m: safe_url(m.group("url")) if m.group("url") else _masked_value(m), text
    )


def _masked_value(match: re.Match[str]) -> str:
    return f"{match.group('key')}***"

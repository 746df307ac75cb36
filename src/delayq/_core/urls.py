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


_TOKEN = re.compile(r"[^\s'\"`,;()\[\]{}<>]+")
_SHORTEST_FRAGMENT = 3  # shorter tokens ('h', '0', 'db') say nothing of a password


def without_secrets_of(text: str, source: str) -> str:
    """``text`` (a parser's error about ``source``, a URL or connection string that may not
    even parse) with every token that is part of ``source``'s secrets masked, and then
    :func:`mask_secrets`: a library quoting a fragment of a password (``'S3cret'`` of
    ``redis://:S3cret/R@h``, ``"p%zz"`` of a bad escape) shows ``***`` instead."""
    secrets = _secrets_of(source) if isinstance(source, str) else []
    if secrets:

        def hide(match: re.Match[str]) -> str:
            token = match.group(0)
            part_of = len(token) >= _SHORTEST_FRAGMENT and any(token in s for s in secrets)
            return "***" if part_of else token

        text = _TOKEN.sub(hide, text)
    return mask_secrets(text)


def _secrets_of(source: str) -> list[str]:
    """The parts of a URL or libpq string that may hold a secret, however malformed: a URL's
    userinfo after its first ':' (to the last '@'), secret query options, and libpq's
    ``password=`` values."""
    found = []
    match = _USERINFO.match(source)
    if match:
        _user, sep, secret = match.group("userinfo").partition(":")
        if sep and secret:
            found.append(secret)
    for option in _SECRET_OPTION.finditer(source):
        found.append(source[option.end("name") : option.end()])
    for pair in _DSN_SECRETS.finditer(source):
        found.append(pair.group("value").strip("'"))
    return [s for s in found if s]

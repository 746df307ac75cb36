"""Redis URLs shown in messages and pages never carry a password."""

from __future__ import annotations

import pytest

from delayq._core.urls import safe_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@db:6379/0", "redis://:***@db:6379/0"),
        ("rediss://app:s3cret@db:6380/1", "rediss://app:***@db:6380/1"),
        ("redis://db:6379/0", "redis://db:6379/0"),
        ("redis://app@db", "redis://app@db"),  # a user name alone is no secret
        ("not a url", "not a url"),
    ],
)
def test_passwords_are_masked(url: str, shown: str) -> None:
    assert safe_url(url) == shown
    assert "s3cret" not in safe_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://db:6379/0?password=s3cret",
        "unix:///run/redis.sock?db=0&password=s3cret",
        "redis://app:s3/cret@db:6379/0",  # an unencoded "/" in the password
        "redis://app:s3@cret@db:6379/0",  # an unencoded "@"
        "redis+sentinel://:s3cret@h1:26379,h2:26379/mymaster?sentinel_password=s3cret",
    ],
)
def test_every_secret_form_is_masked(url: str) -> None:
    shown = safe_url(url)
    assert "s3cret" not in shown and "cret" not in shown
    assert "***" in shown

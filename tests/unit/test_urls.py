"""Redis URLs shown in messages and pages never carry a password."""

from __future__ import annotations

import pytest

from delayq._core.urls import mask_secrets, safe_url, without_secrets_of


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


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # Sentinel and Cluster: one userinfo before many hosts
        (
            "redis+sentinel://u:s3cret@h1:26379,h2:26379/mymaster/0",
            "redis+sentinel://u:***@h1:26379,h2:26379/mymaster/0",
        ),
        ("redis+cluster://:s3cret@h1:7000,h2:7001", "redis+cluster://:***@h1:7000,h2:7001"),
        # PostgreSQL URLs, one host or many, and libpq's query options
        ("postgresql://app:s3cret@db:5432/shop", "postgresql://app:***@db:5432/shop"),
        ("postgres://app:s3cret@h1,h2:5433/shop", "postgres://app:***@h1,h2:5433/shop"),
        (
            "postgresql://app@db/shop?sslmode=require&sslpassword=s3cret",
            "postgresql://app@db/shop?sslmode=require&sslpassword=***",
        ),
        ("postgresql://app@db/shop", "postgresql://app@db/shop"),
        # libpq's key=value form
        (
            "host=db user=app password=s3cret dbname=shop",
            "host=db user=app password=*** dbname=shop",
        ),
        ("password = 's3 \\' cret' host=db", "password = *** host=db"),
        ("host=db password='s3cret", "host=db password=***"),  # unterminated: all of it
        ("host=db sslpassword=s3cret", "host=db sslpassword=***"),
        ("host=db user=app dbname=shop", "host=db user=app dbname=shop"),
        ("bypass=1 compass=2", "bypass=1 compass=2"),  # not names of secrets
    ],
)
def test_every_url_and_dsn_form(url: str, shown: str) -> None:
    assert safe_url(url) == shown
    assert "s3" not in safe_url(url) and "cret" not in safe_url(url)


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (
            "Error connecting to redis://u:s3cret@h:6379/0. Refused.",
            "Error connecting to redis://u:***@h:6379/0. Refused.",
        ),
        (
            "bad url 'redis://h/0?password=s3cret&db=1' (twice: redis://:s3cret@h2)",
            "bad url 'redis://h/0?password=***&db=1' (twice: redis://:***@h2)",
        ),
        ("unix:///run/r.sock?password=s3cret refused", "unix:///run/r.sock?password=*** refused"),
        (
            "'redis://u:pa'ss@h' is odd",  # a quote inside the password does not end the URL
            "'redis://u:***@h' is odd",
        ),
        (
            'invalid dsn: missing "=" after "host=db password=s3cret x" in connection info',
            'invalid dsn: missing "=" after "host=db password=*** x" in connection info',
        ),
        (
            "connection to postgresql://app:s3cret@db/shop failed: password authentication "
            "failed for user app",
            "connection to postgresql://app:***@db/shop failed: password authentication "
            "failed for user app",
        ),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_messages_mask_every_secret_in_them(message: str, shown: str) -> None:
    assert mask_secrets(message) == shown


@pytest.mark.parametrize(
    ("source", "error", "secret"),
    [
        ("redis://:S3cret/R@h/0", "Port could not be cast to integer value as 'S3cret'", "S3cret"),
        ("postgresql://u:p%zzw@h/db", 'invalid percent-encoded token: "p%zzw"', "zzw"),
        ("host=h password='S3c ret", "bad value near S3c", "S3c"),
        ("redis://h/0?password=hunter2&x=1", "cannot use hunter2 here", "hunter2"),
    ],
)
def test_parse_errors_show_no_fragment_of_a_password(source: str, error: str, secret: str) -> None:
    shown = without_secrets_of(error, source)
    assert secret not in shown and "***" in shown


def test_parse_errors_keep_what_is_no_secret() -> None:
    shown = without_secrets_of("Port could not be cast as 'notaport'", "redis://:pw@h:notaport/0")
    assert "notaport" in shown

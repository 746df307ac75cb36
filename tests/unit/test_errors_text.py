"""error_summary(): the exception's type and message out of a stored error text."""

from __future__ import annotations

import traceback

import pytest

from delayq._core.errors_text import error_summary, redis_error_text
from delayq._core.handling import describe


def formatted(exc: BaseException) -> str:
    try:
        raise exc
    except BaseException as caught:
        return describe(caught)


def nested(depth: int) -> None:
    if depth:
        nested(depth - 1)
    raise RuntimeError("boom")


def test_a_traceback_gives_its_last_line() -> None:
    try:
        nested(3)
    except RuntimeError as exc:
        text = describe(exc)
    assert text.startswith("Traceback (most recent call last)")
    assert error_summary(text) == "RuntimeError: boom"


def test_a_multi_line_message_is_joined_on_one_line() -> None:
    assert error_summary(formatted(ValueError("first line\nsecond  line"))) == (
        "ValueError: first line second line"
    )


def test_a_chained_exception_gives_the_outermost() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise LookupError("outer") from inner
    except LookupError as exc:
        text = "".join(traceback.format_exception(exc))
    assert "KeyError" in text and error_summary(text) == "LookupError: outer"


def test_a_text_cut_at_its_start_still_gives_the_exception() -> None:
    try:
        nested(3)
    except RuntimeError as exc:
        text = describe(exc)
    cut = text[text.index("  File ") + 3 :]  # the header and half a frame line gone
    assert error_summary(cut) == "RuntimeError: boom"


@pytest.mark.parametrize(
    ("text", "summary"),
    [
        (None, ""),
        ("", ""),
        ("failed 3", "failed 3"),
        ("rejected:  bad\n input", "rejected: bad input"),
        ("Traceback (most recent call last):\n", ""),
        ('Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n',
         'File "x.py", line 1, in f'),
    ],
)  # fmt: skip
def test_other_texts(text: str | None, summary: str) -> None:
    assert error_summary(text) == summary


def test_width_cuts_with_an_ellipsis() -> None:
    assert error_summary("RuntimeError: " + "x" * 100, width=20) == "RuntimeError: xxxxx…"
    assert len(error_summary("y" * 100, width=20)) == 20
    assert error_summary("short", width=20) == "short"


def test_a_sentinel_client_written_out_whole_is_named_by_its_address() -> None:
    """redis-py's MasterNotFoundError names each sentinel by the client's repr (about a
    thousand characters of pool options, on one line of the CLI's error)."""
    client = (
        "<redis.client.Redis(<redis.connection.ConnectionPool(<redis.connection.Connection("
        "db=0,username=<REDACTED>,password=*** object at 0x7f82>,host=10.0.0.5,port=26379,"
        "socket_keepalive_options=<object object at 0x7f8>,orig_host_address=10.0.0.5)>)>)>"
    )
    text = (
        f"No master found for 'mymaster' : {client} - network:ConnectionError: Error 111 "
        f"connecting to 10.0.0.5:26379. Connection refused., {client} - TimeoutError: t/o"
    )
    assert redis_error_text(Exception(text)) == (
        "No master found for 'mymaster' : sentinel 10.0.0.5:26379: network:ConnectionError: "
        "Error 111 connecting to 10.0.0.5:26379. Connection refused., sentinel 10.0.0.5:26379: "
        "TimeoutError: t/o"
    )
    assert redis_error_text("Connection refused") == "Connection refused"

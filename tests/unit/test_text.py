"""Text from Redis is shown with every control, bidi and surrogate character escaped."""

from __future__ import annotations

from delayq._core.text import is_printable, printable, utf8_safe


def test_escape_sequences_and_bidi_are_escaped() -> None:
    hostile = "ok\x1b[31mred\x9b\u202egnp.exe\x00\r"
    shown = printable(hostile)
    assert shown == "ok\\x1b[31mred\\x9b\\u202egnp.exe\\x00\\x0d"
    assert is_printable(shown) and not is_printable(hostile)


def test_newlines_kept_only_when_asked() -> None:
    assert printable("a\nb") == "a\\x0ab"
    assert printable("a\nb\tc", keep_newlines=True) == "a\nb\tc"


def test_surrogates_and_bytes() -> None:
    assert printable("file\udcff") == "file\\udcff"
    assert printable(b"id\xff\xfe") == "id\\xff\\xfe"
    assert utf8_safe("x\udcffy").encode("utf-8") == b"x\\udcffy"
    assert utf8_safe("plain é") == "plain é"


def test_ordinary_unicode_untouched() -> None:
    assert printable("订单 42 — ok") == "订单 42 — ok"

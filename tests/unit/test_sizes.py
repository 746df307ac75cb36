"""Sizes in bytes as options take them (``--batch-bytes 4MiB``)."""

from __future__ import annotations

import pytest

from delayq._core.sizes import parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("4194304", 4 << 20), ("512KiB", 512 << 10), (" 4 MiB ", 4 << 20),
     ("1GiB", 1 << 30), ("10B", 10)],
)  # fmt: skip
def test_sizes_in_bytes_and_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "4MB", "4mib", "-1", "1.5MiB", "MiB", "9" * 14, "4 MiB 2"])
def test_other_text_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a batch size: .* 512KiB, 4MiB"):
        parse_size(text, "batch size")

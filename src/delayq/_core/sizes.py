"""Sizes in bytes as people write them (``4MiB``), for options given as text."""

from __future__ import annotations

import re
from typing import Final

_SIZE: Final = re.compile(r"([0-9]{1,13})\s*(B|KiB|MiB|GiB)?")
_UNIT: Final = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
_HINT: Final = "bytes, or a number with KiB, MiB or GiB: 4194304, 512KiB, 4MiB"


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from ``4194304``, ``4MiB``, ``512KiB`` or ``1GiB``; binary units only (a ``4MB``
    could mean either). A :class:`ValueError` saying ``not a <what>`` else."""
    found = _SIZE.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"not a {what}: {text!r} ({_HINT})")
    return int(found.group(1)) * _UNIT[found.group(2)]

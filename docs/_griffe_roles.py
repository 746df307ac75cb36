"""griffe extension for the API reference: the docstrings' Sphinx roles (:class:`X`,
:meth:`~delayq.DelayQueue.dead`) become links to the documented object, or code where the
target has no page, instead of showing as raw text. A link to a member that is not rendered
fails the strict build, as a broken reference should."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|exc|obj|data|mod):`~?\.?([\w.]+)(?:\(\))?`")
INIT = Path(__file__).resolve().parents[1] / "src" / "delayq" / "__init__.py"
# Documented objects outside delayq.__all__ (docs/reference/extras.md).
EXTRA_PAGES = {"delayq.metrics.WorkerMetrics", "delayq.embedded.EmbeddedRedis"}


def public_names() -> set[str]:
    """delayq.__all__, read without importing the package."""
    for node in ast.parse(INIT.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


class SphinxRoles(griffe.Extension):
    def __init__(self) -> None:
        self.public = public_names()

    def _link(self, match: re.Match[str]) -> str:
        target = match.group(1)
        full = target if target.startswith("delayq.") else f"delayq.{target}"
        parts = full.split(".")
        if (len(parts) >= 2 and parts[1] in self.public) or full in EXTRA_PAGES:
            return f"[`{parts[-1]}`][{full}]"
        return f"`{parts[-1]}`"

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(self._link, obj.docstring.value)

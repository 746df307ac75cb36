"""Contestants of the peer benchmark: every :class:`~bench.peers.base.Contestant` subclass with a
``name`` found in the modules of this package (``*_app`` modules are worker-side and skipped).

Modules that fail to import (a missing peer library) are reported as unavailable contestants.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence

from .base import Contestant, Job

#: the order of the tables; names not listed here come after, alphabetically
ORDER = [
    "delayq",
    "delayq-async",
    "arq",
    "saq",
    "rq",
    "dramatiq",
    "celery",
    "huey",
    "bullmq-node",  # before bullmq-py, whose preloads it does: its measured rate times them
    "bullmq-py",
    "docket",
    "docket-tuned",
    "streaq",
    "taskiq",
    "taskiq-tuned",
    "bare-loop",
]


class Broken(Contestant):
    """Stands in for a contestant module that failed to import."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self._reason = reason

    def version(self) -> str:
        return "?"

    def unavailable(self) -> str | None:
        return self._reason

    def enqueue(self, url: str, queue: str, jobs: Sequence[Job], bulk: bool) -> float:
        raise RuntimeError(self._reason)

    def worker_argv(self, url: str, queue: str, sink: str, hold: bool) -> list[str]:
        raise RuntimeError(self._reason)


def discover() -> list[Contestant]:
    """One instance of every contestant, in :data:`ORDER`."""
    found: dict[str, Contestant] = {}
    for info in pkgutil.iter_modules(__path__):
        mod_name = info.name
        if mod_name == "base" or mod_name.endswith("_app") or mod_name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{__name__}.{mod_name}")
        except Exception as exc:  # a peer library missing or broken: say so, run the rest
            found[mod_name] = Broken(mod_name, f"import failed: {type(exc).__name__}: {exc}")
            continue
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, Contestant)
                and obj.__module__ == module.__name__
                and isinstance(getattr(obj, "name", None), str)
                and not getattr(obj, "__abstractmethods__", None)
            ):
                try:
                    instance = obj()
                except Exception as exc:
                    instance = Broken(obj.name, f"{type(exc).__name__}: {exc}")
                found[instance.name] = instance

    def rank(name: str) -> tuple[int, str]:
        return (ORDER.index(name) if name in ORDER else len(ORDER), name)

    return [found[name] for name in sorted(found, key=rank)]

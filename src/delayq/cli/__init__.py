"""The ``delayq`` command line (``python -m delayq.cli`` or the ``delayq`` script)."""

from .app import app, main

__all__ = ["app", "main"]

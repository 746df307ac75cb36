"""The synchronous front end; ``queue.py`` here is generated from ``_async`` (do not edit)."""

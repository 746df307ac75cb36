"""The sync outbox, generated from ``_async`` by ``scripts/unasync.py``: do not edit."""

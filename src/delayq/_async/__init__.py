"""The asyncio front end. ``_sync`` is generated from it by ``scripts/unasync.py``."""

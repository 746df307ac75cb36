"""The outbox for asyncio. ``_sync`` is generated from it by ``scripts/unasync.py``."""

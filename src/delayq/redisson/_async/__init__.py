"""The asyncio side of ``delayq.redisson``. ``_sync`` is generated from it by
``scripts/unasync.py``."""

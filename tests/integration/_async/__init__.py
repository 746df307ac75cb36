"""Tests written once, with ``await``, on the asyncio front end; ``_sync`` holds the same
tests for the sync front end, generated from these by ``scripts/unasync.py``.

What the two flavours cannot share (running a call in the background, waiting on a
condition, a blocking call) is in ``flavor.py``, written by hand on each side.
"""

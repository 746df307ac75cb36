"""The synchronous side of ``delayq.redisson``, generated from ``_async``."""

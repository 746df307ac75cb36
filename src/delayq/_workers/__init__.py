"""Worker runtimes: ``Worker`` (threads) and ``AsyncWorker`` (asyncio)."""

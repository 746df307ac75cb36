"""The sans-I/O core: key names, the task envelope, script arguments and replies.

Nothing here imports ``redis`` or ``asyncio``; the sync and asyncio front ends share it.
"""

# arq, shown for comparison: NOT run by delayq's tests (arq is not a dependency).
from datetime import timedelta

from arq import create_pool
from arq.connections import RedisSettings


async def charge(ctx, order_id):
    ...


class WorkerSettings:  # $ arq app.WorkerSettings
    functions = [charge]


async def main():
    redis = await create_pool(RedisSettings())
    await redis.enqueue_job(
        "charge", 42, _defer_by=timedelta(minutes=5), _job_id="c-42"
    )
    # _defer_until=datetime(...) for a due time

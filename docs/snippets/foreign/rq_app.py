# RQ, shown for comparison: NOT run by delayq's tests (RQ is not a dependency).
from datetime import UTC, datetime, timedelta

from redis import Redis
from rq import Queue

q = Queue("emails", connection=Redis())

job = q.enqueue_in(timedelta(minutes=10), send_reminder, "ada@example.com")
q.enqueue_at(datetime(2030, 1, 1, tzinfo=UTC), send_newsletter)
job.cancel()
status = job.get_status()
# $ rq worker --with-scheduler emails

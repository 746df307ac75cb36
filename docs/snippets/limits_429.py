"""A provider's 429: the handler raises RateLimited, the tenant's tasks wait that long, the
task keeps its place and the attempt is not counted."""

import os
import threading

from delayq import DelayQueue, Offer, RateLimited, Worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
queue = DelayQueue("sms", redis=REDIS_URL)
sent = threading.Event()
calls = []


# --8<-- [start:handler]
class TooManyRequests(Exception):
    retry_after = 0.5  # what the provider's Retry-After header said


def send_sms(payload: dict) -> None:
    calls.append(payload["to"])
    if len(calls) == 1:
        raise TooManyRequests()  # the provider's first answer is a 429


def handle(task):
    try:
        send_sms(task.payload)
    except TooManyRequests as exc:
        raise RateLimited(exc.retry_after) from exc  # the key waits; no attempt is counted
    print(f"sent to {task.payload['to']} on attempt {task.attempts}")
    sent.set()


queue.offer_many([Offer({"to": "+15550100"}, limit_key="provider:twilio")])
# --8<-- [end:handler]
worker = Worker(queue, handle, concurrency=1)
thread = threading.Thread(target=worker.run)
thread.start()
assert sent.wait(10)
worker.stop()
thread.join(10)
throttled = queue.stats().counters["throttled:ratelimited"]
print(throttled, "throttled; the provider was called", len(calls), "times")
queue.close()

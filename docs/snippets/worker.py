"""A thread Worker: return = ack, raise = retry after backoff, Retry / Reject to choose."""

import os

from delayq import Backoff, DelayQueue, Reject, Retry, Task, Worker

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

queue = DelayQueue("orders", redis=REDIS_URL, retry_backoff=Backoff(base=0.1, max=1))
closed: set[int] = set()


def close_order(task: Task) -> None:
    order = task.payload
    if order.get("fraud"):
        raise Reject("flagged as fraud")  # dead-letter now, for a human to look at
    if order.get("flaky") and task.attempts < 3:
        raise Retry(delay=0.1, reason="payment service busy")  # again in 0.1 s
    closed.add(order["order_id"])  # returning acks the task
    if closed == {1, 2}:
        worker.stop()  # a real worker runs until SIGTERM; this one stops when done


queue.offer({"order_id": 1}, delay=0.2)
queue.offer({"order_id": 2, "flaky": True}, delay=0.2)
queue.offer({"order_id": 3, "fraud": True}, delay=0.1)

# handle_signals=True: this script owns its process, so SIGTERM or Ctrl-C stop the worker
# gracefully (a worker inside a web app leaves the signals to the app: start_background()).
worker = Worker(queue, close_order, concurrency=4, timeout=60, handle_signals=True)
worker.run()  # blocks until stop()

(dead,) = queue.dead()
print("closed", sorted(closed), "| dead-lettered:", dead.payload, dead.error)
queue.close()

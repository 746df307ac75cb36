"""Prometheus metrics from Python: a worker's own metrics and its queue's, on one endpoint."""

# --8<-- [start:usage]
import os

from prometheus_client import CollectorRegistry, start_http_server

from delayq import DelayQueue, Task, Worker
from delayq.metrics import QueueCollector, WorkerMetrics

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
PORT = int(os.environ.get("METRICS_PORT", "9809"))  # the docs' tests pass 0: a free port

registry = CollectorRegistry()  # or leave it out: the global REGISTRY
recorder = WorkerMetrics(registry)  # worker metrics, on that registry
registry.register(QueueCollector(REDIS_URL, queues=["orders"]))  # queue metrics
server, _ = start_http_server(PORT, "127.0.0.1", registry)


def close_order(task: Task) -> None:
    print("closing order", task.payload["order_id"])
    worker.stop()  # this sample stops after one task; a real worker runs until SIGTERM


queue = DelayQueue("orders", REDIS_URL)
worker = Worker(queue, close_order, metrics=recorder)  # AsyncWorker takes metrics= too
queue.offer({"order_id": 1})
worker.run()
# --8<-- [end:usage]

# The check: one scrape has the worker's metrics and the queue's.
import urllib.request  # noqa: E402

scrape = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics").read().decode()
assert "delayq_worker_tasks_total" in scrape and 'delayq_tasks{queue="orders"' in scrape, scrape
server.shutdown()
queue.close()

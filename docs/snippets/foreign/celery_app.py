# Celery, shown for comparison: NOT run by delayq's tests (Celery is not a dependency).
from datetime import UTC, datetime, timedelta

from celery import Celery

app = Celery("shop", broker="redis://127.0.0.1:6379/0")


@app.task(bind=True, acks_late=True, max_retries=10)
def close_order(self, order_id):
    if payment_service_busy():
        raise self.retry(countdown=60)
    close_if_unpaid(order_id)


result = close_order.apply_async(args=[42], countdown=1800)
close_order.apply_async(args=[43], eta=datetime.now(UTC) + timedelta(hours=2))
result.revoke()  # workers skip it when it is due; the message stays until then
# $ celery -A shop worker

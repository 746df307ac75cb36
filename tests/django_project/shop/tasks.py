"""The shop's delayq handlers (``DELAYQ["QUEUES"][name]["HANDLER"]``)."""

import logging
import time

from django.db.models import F
from django.utils import timezone

from delayq import Task

from .models import Order


def close_order(task: Task) -> None:
    """Close the order if it is still pending; idempotent, so a redelivery changes nothing."""
    order_id = task.payload["order_id"]
    Order.objects.filter(id=order_id).update(close_deliveries=F("close_deliveries") + 1)
    Order.objects.filter(id=order_id, status=Order.Status.PENDING).update(
        status=Order.Status.CLOSED, closed_at=timezone.now()
    )


def send_receipt(task: Task) -> None:
    """Mail a receipt; ``payload["seconds"]`` stands for the time the mail server takes."""
    logging.getLogger("shop").info("sending receipt %s", task.id)
    time.sleep(task.payload["seconds"])
    logging.getLogger("shop").info("sent receipt %s", task.id)

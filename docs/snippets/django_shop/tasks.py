from delayq import Task

from .models import Order


def close_order(task: Task) -> None:
    """The handler of DELAYQ["QUEUES"]["orders"]: closes the order only if still unpaid,
    so a second delivery of the same task changes nothing."""
    Order.objects.filter(id=task.payload["order_id"], status="pending").update(status="closed")

from django.db import transaction

from delayq.contrib import django as delayq_django

from .models import Order


def place_order(payment_window_s: float = 1800) -> Order:
    """The order and its close task commit together, or neither does."""
    with transaction.atomic():
        order = Order.objects.create()
        order.close_task_id = delayq_django.offer(
            "orders", {"order_id": order.id}, delay=payment_window_s, key=f"close:{order.id}"
        )
        order.save(update_fields=["close_task_id"])
    return order


def pay_order(order_id: int) -> bool:
    """Pay a pending order and cancel its close task, in one transaction."""
    with transaction.atomic():
        paid = Order.objects.filter(id=order_id, status="pending").update(status="paid")
        if paid:
            delayq_django.cancel("orders", Order.objects.get(id=order_id).close_task_id)
    return bool(paid)


def place_order_on_commit(payment_window_s: float = 1800) -> Order:
    """Without an outbox: the task is sent to Redis right after the commit (see the limits)."""
    with transaction.atomic():
        order = Order.objects.create()
        order.close_task_id = delayq_django.offer_on_commit(
            "orders", {"order_id": order.id}, delay=payment_window_s
        )
        order.save(update_fields=["close_task_id"])
    return order

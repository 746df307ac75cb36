"""The shop's two endpoints, each in both flavours: the outbox and ``on_commit``."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from delayq.contrib import django as delayq_django

from .models import Order

QUEUE = "orders"


def _delay(request: HttpRequest) -> float:
    return float(request.GET.get("delay", "1800"))


def place_order(request: HttpRequest) -> JsonResponse:
    """Place an order and, in the same transaction, its close task (through the outbox)."""
    with transaction.atomic():
        order = Order.objects.create()
        order.close_task_id = delayq_django.offer(
            QUEUE, {"order_id": order.id}, delay=_delay(request), key=f"close:{order.id}"
        )
        order.save(update_fields=["close_task_id"])
    return JsonResponse({"id": order.id, "close_task_id": order.close_task_id}, status=201)


def pay_order(request: HttpRequest, order_id: int) -> JsonResponse:
    """Pay an order and cancel its close task in the same transaction."""
    with transaction.atomic():
        paid = Order.objects.filter(id=order_id, status=Order.Status.PENDING).update(
            status=Order.Status.PAID
        )
        if not paid:
            return JsonResponse({"error": "order is not pending"}, status=409)
        order = Order.objects.get(id=order_id)
        delayq_django.cancel(QUEUE, order.close_task_id)
    return JsonResponse({"id": order_id, "status": "paid"})


def place_order_on_commit(request: HttpRequest) -> JsonResponse:
    """Place an order; its close task goes to Redis after the commit (no outbox)."""
    with transaction.atomic():
        order = Order.objects.create()
        order.close_task_id = delayq_django.offer_on_commit(
            QUEUE, {"order_id": order.id}, delay=_delay(request), key=f"close:{order.id}"
        )
        order.save(update_fields=["close_task_id"])
    return JsonResponse({"id": order.id, "close_task_id": order.close_task_id}, status=201)


def pay_order_on_commit(request: HttpRequest, order_id: int) -> JsonResponse:
    """Pay an order; its close task is cancelled after the commit (no outbox)."""
    with transaction.atomic():
        paid = Order.objects.filter(id=order_id, status=Order.Status.PENDING).update(
            status=Order.Status.PAID
        )
        if not paid:
            return JsonResponse({"error": "order is not pending"}, status=409)
        delayq_django.cancel_on_commit(QUEUE, Order.objects.get(id=order_id).close_task_id)
    return JsonResponse({"id": order_id, "status": "paid"})

"""delayq for Django: settings, a transactional outbox on Django's own connection, management
commands, and an ``on_commit`` path for projects without an outbox.

::

    INSTALLED_APPS = [..., "delayq.contrib.django"]   # migrations for the outbox table
    DELAYQ = {"REDIS_URL": "redis://…", "QUEUES": {"orders": "shop.tasks.close_order"}}

    from django.db import transaction
    from delayq.contrib import django as delayq_django

    with transaction.atomic():
        order = Order.objects.create(...)
        order.close_task_id = delayq_django.offer("orders", {"order_id": order.id},
                                                  delay=1800, key=f"close:{order.id}")
        order.save()

Run ``manage.py delayq_relay`` (moves committed offers to Redis) and ``manage.py
delayq_worker`` (runs the handlers). See docs/django.md.
"""

from .conf import DelayqSettings, QueueSettings, delayq_settings
from .on_commit import cancel_on_commit, offer_on_commit
from .outbox import cancel, get_outbox, offer, reschedule
from .queues import close_queues, get_queue

__all__ = [
    "DelayqSettings",
    "QueueSettings",
    "cancel",
    "cancel_on_commit",
    "close_queues",
    "delayq_settings",
    "get_outbox",
    "get_queue",
    "offer",
    "offer_on_commit",
    "reschedule",
]

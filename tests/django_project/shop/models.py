from django.db import models


class Order(models.Model):
    """An order that closes by itself unless it is paid within its payment window."""

    class Status(models.TextChoices):
        PENDING = "pending"
        PAID = "paid"
        CLOSED = "closed"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    close_task_id = models.CharField(max_length=256, blank=True)
    closed_at = models.DateTimeField(null=True)
    # Each delivery of the close task, effective or not (a repeat finds the order closed).
    close_deliveries = models.IntegerField(default=0)

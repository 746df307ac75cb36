from django.db import models


class Order(models.Model):
    status = models.CharField(max_length=16, default="pending")  # pending, paid, closed
    close_task_id = models.CharField(max_length=256, blank=True)

    class Meta:
        app_label = "django_shop"

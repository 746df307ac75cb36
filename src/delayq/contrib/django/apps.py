"""The Django app: ``INSTALLED_APPS = [..., "delayq.contrib.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class DelayqConfig(AppConfig):
    """Brings the outbox table (migrations) and the ``delayq_worker`` and ``delayq_relay``
    management commands."""

    name = "delayq.contrib.django"
    label = "delayq"
    verbose_name = "delayq"

    def ready(self) -> None:
        from . import queues  # noqa: F401 - connects the setting_changed handler

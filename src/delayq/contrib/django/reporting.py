"""An exception reporter filter that masks the password of every URL or DSN in the settings.

Django's own filter hides settings whose *name* looks secret (``SECRET_KEY``, ``PASSWORD``,
...), so ``DELAYQ["REDIS_URL"] = "redis://:s3cret@cache:6379/0"`` shows whole on the debug
page and in the ADMINS e-mails. Set::

    DEFAULT_EXCEPTION_REPORTER_FILTER = "delayq.contrib.django.reporting.SafeUrlReporterFilter"

and every string setting that is a URL or a libpq connection string is shown with its
password masked (``redis://:***@cache:6379/0``), wherever it is nested.
"""

from __future__ import annotations

from typing import Any

from django.views.debug import SafeExceptionReporterFilter

from ..._core.urls import safe_url


class SafeUrlReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, plus the password of every URL or connection string masked."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str) and ("://" in cleansed or "=" in cleansed):
            return safe_url(cleansed)
        return cleansed

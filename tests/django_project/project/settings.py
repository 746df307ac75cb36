"""Settings of the small shop the Django integration is tested on.

The test fixture creates a private PostgreSQL database and a private Redis and hands them
over in the environment: ``DELAYQ_TEST_DB`` (database name), ``REDIS_URL``, ``DELAYQ_PREFIX``.
"""

import os

from delayq import Durability

SECRET_KEY = "test-only"  # a test project, never deployed
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "delayq.contrib.django",
    "shop",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DELAYQ_TEST_DB", "delayq_django_example"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
    }
}

# Offers of the orders queue confirmed by one replica, within DELAYQ_TEST_DURABILITY_S seconds
# (the delayq_relay test on a master with a replica sets it; others run without).
_DURABILITY = (
    {"durability": Durability(replicas=1, timeout=float(os.environ["DELAYQ_TEST_DURABILITY_S"]))}
    if os.environ.get("DELAYQ_TEST_DURABILITY_S")
    else {}
)

DELAYQ = {
    "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    "PREFIX": os.environ.get("DELAYQ_PREFIX", "dq"),
    "QUEUES": {
        "orders": {
            "HANDLER": "shop.tasks.close_order",
            "OPTIONS": {"visibility_timeout": 10, **_DURABILITY},
        },
        # Slow handlers, for the worker command's graceful stop (tests/integration/test_django.py).
        "receipts": {"HANDLER": "shop.tasks.send_receipt", "OPTIONS": {"visibility_timeout": 30}},
    },
    "WORKER": {"concurrency": 4, "grace": 5},
}

# As a project usually has it: one handler, on the root logger (the delayq_worker command then
# leaves logging as it is; it sets it up only when nothing did).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
}

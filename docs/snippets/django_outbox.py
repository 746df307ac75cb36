"""delayq in a Django project (docs/django.md): settings, the outbox, the on_commit path.

A real project puts the settings in settings.py and runs `manage.py migrate`, `manage.py
delayq_relay` and `manage.py delayq_worker`; this sample does the same in one process.
"""

import os
import time
from collections.abc import Callable

import django
from django.conf import settings
from django.core.management import call_command
from pgsample import temp_database
from psycopg.conninfo import conninfo_to_dict

from delayq import DelayQueue
from delayq.outbox import Relay

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
DSN = temp_database()  # postgresql://…, this sample's own database, dropped at exit

# --8<-- [start:settings]
INSTALLED_APPS = [
    # ...
    "delayq.contrib.django",  # the outbox table's migration, the management commands
    "django_shop",
]
DELAYQ = {
    "REDIS_URL": REDIS_URL,  # default: $REDIS_URL
    "PREFIX": "dq",
    "DATABASE": "default",  # the PostgreSQL database that holds the outbox
    "QUEUES": {
        "orders": {
            "HANDLER": "django_shop.tasks.close_order",  # for manage.py delayq_worker
            "OPTIONS": {"visibility_timeout": 60, "max_attempts": 5},  # DelayQueue options
        },
    },
    "WORKER": {"concurrency": 8},  # Worker options for manage.py delayq_worker
}
# --8<-- [end:settings]

params = conninfo_to_dict(DSN)
settings.configure(
    INSTALLED_APPS=INSTALLED_APPS,
    DELAYQ=DELAYQ,
    USE_TZ=True,
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": params["dbname"],
            "USER": params.get("user", "postgres"),
            "HOST": params.get("host", "127.0.0.1"),
            "PORT": params.get("port", "5432"),
        }
    },
)
django.setup()
call_command("migrate", run_syncdb=True, verbosity=0)  # the outbox table and the shop's

# Django's apps are loaded: the shop's modules can be imported now.
from django_shop.models import Order  # noqa: E402
from django_shop.orders import pay_order, place_order, place_order_on_commit  # noqa: E402

from delayq.contrib.django.database import conninfo  # noqa: E402

relay = Relay(conninfo(), REDIS_URL).start()  # what `manage.py delayq_relay` runs
queue = DelayQueue("orders", redis=REDIS_URL)


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the relay did not move the task"
        time.sleep(0.01)


order = place_order()
wait_for(lambda: queue.get(order.close_task_id) is not None)  # committed -> in Redis
assert pay_order(order.id)
wait_for(lambda: queue.get(order.close_task_id) is None)  # paid -> task cancelled

direct = place_order_on_commit()
assert queue.get(direct.close_task_id) is not None  # sent by the commit itself
queue.cancel(direct.close_task_id)
print(Order.objects.values_list("id", "status").order_by("id")[:5])

relay.stop()
queue.close()
from django.db import connections  # noqa: E402

connections.close_all()

"""Each outbox row's own apply id (delayq.outbox's exactly-once receipts): the same idempotent
DDL as 0001, which adds the column to a table installed before it."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def install(apps: Any, schema_editor: Any) -> None:
    from delayq.contrib.django.outbox import migrate_install

    migrate_install(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("delayq", "0001_outbox")]
    operations = [migrations.RunPython(install, migrations.RunPython.noop)]

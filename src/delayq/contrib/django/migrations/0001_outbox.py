"""The outbox table, its indexes and its NOTIFY trigger, from :mod:`delayq.outbox`'s own DDL
(the statements are idempotent, so the table may also have been made by ``outbox install``)."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def install(apps: Any, schema_editor: Any) -> None:
    from delayq.contrib.django.outbox import migrate_install

    migrate_install(schema_editor)


def uninstall(apps: Any, schema_editor: Any) -> None:
    from delayq.contrib.django.outbox import migrate_uninstall

    migrate_uninstall(schema_editor)


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [migrations.RunPython(install, uninstall)]

"""An index of the unfinished runs by plan (the admin's plan filter counts them), built without a long lock.

On PostgreSQL the index is built CONCURRENTLY, which cannot run inside a transaction (hence atomic = False): a
populated run_state keeps taking writes while it is built. Other databases build it as usual.
"""

from django.db import migrations, models
from django.db.models import Q


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL (without django.contrib.postgres, which needs a PostgreSQL
    driver even on a site that runs SQLite)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, concurrently=True)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, concurrently=True)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY refuses to run in a transaction

    dependencies = [
        ("durableruns", "0015_waits"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["plan_fingerprint"], name="run_state_unfinished_plan_idx",
                               condition=Q(status__in=["pending", "running", "waiting", "needs_decision"])),
        ),
    ]

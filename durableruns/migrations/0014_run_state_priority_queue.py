"""A run's priority and queue (issue 24: the backend for Django's Tasks, and resume_runs --queue).

Both columns have a constant database default, so adding them to a populated run_state rewrites nothing. The
claim's index gains the priority, in the claim's order: on PostgreSQL the new one is built CONCURRENTLY (writes go
on meanwhile) beside the old one, which is then dropped CONCURRENTLY, and the new one takes the old name.
"""

from django.db import migrations, models


class AddIndexConcurrentlyOnPostgreSQL(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL (no lock on writes while it builds)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _index_op(schema_editor, "add_index", model, self.index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _index_op(schema_editor, "remove_index", model, self.index)


class RemoveIndexConcurrentlyOnPostgreSQL(migrations.RemoveIndex):
    """RemoveIndex, dropped CONCURRENTLY on PostgreSQL."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _index_op(schema_editor, "remove_index", model, index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            _index_op(schema_editor, "add_index", model, index)


def _index_op(schema_editor, name, model, index):
    if schema_editor.connection.vendor == "postgresql":
        getattr(schema_editor, name)(model, index, concurrently=True)
    else:
        getattr(schema_editor, name)(model, index)


ACTIVE = models.Q(("status__in", ["pending", "running", "waiting"]))


class Migration(migrations.Migration):
    atomic = False  # CREATE / DROP INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [
        ("durableruns", "0013_run_schedule"),
    ]

    operations = [
        migrations.AddField(
            model_name="runstate",
            name="priority",
            field=models.IntegerField(db_default=0, default=0, help_text="Among due runs, a higher priority is claimed first (then the oldest first)."),
        ),
        migrations.AddField(
            model_name="runstate",
            name="queue",
            field=models.CharField(db_default="default", default="default", help_text="The queue the run is on: a worker started with resume_runs --queue takes only its queues' runs.", max_length=100),
        ),
        AddIndexConcurrentlyOnPostgreSQL(
            model_name="runstate",
            index=models.Index(condition=ACTIVE, fields=["-priority", "created_at"], name="run_state_claim_idx"),
        ),
        RemoveIndexConcurrentlyOnPostgreSQL(model_name="runstate", name="run_state_active_idx"),
        migrations.RenameIndex(model_name="runstate", new_name="run_state_active_idx", old_name="run_state_claim_idx"),
    ]

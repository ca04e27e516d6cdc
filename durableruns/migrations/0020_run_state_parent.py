"""Child runs (issue 23): the run that started a run, and an index of children by parent.

The column is nullable with no default, so adding it rewrites nothing on PostgreSQL. The index covers children
only (parent_id IS NOT NULL); on PostgreSQL it is built CONCURRENTLY, which cannot run inside a transaction
(hence atomic = False), so a populated run_state keeps taking writes while it is built.
"""

from django.db import migrations, models
from django.db.models import Q


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    """AddIndex, built CONCURRENTLY on PostgreSQL (as in 0016)."""

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

    # 0017 is another branch's (a concurrency key); this one is renumbered after it when both are merged.
    dependencies = [
        ("durableruns", "0019_run_state_concurrency_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="runstate",
            name="parent_id",
            field=models.CharField(
                blank=True, max_length=200, null=True,
                help_text="The run that started this one as a child (ctx.start_run), recorded in the commit that "
                          "created it; NULL for a run started otherwise. A join of the parent waits until its "
                          "children end."),
        ),
        migrations.AlterField(  # a join's completion: choices only, nothing changes in the database
            model_name="runstep",
            name="resolution",
            field=models.CharField(blank=True, choices=[
                ("returned", "the step returned"), ("lookup", "resolved by lookup"), ("decision", "decided by staff"),
                ("skipped", "skipped: its when= said no"), ("event", "an event sent to the run"),
                ("timer", "its wake time came"), ("timeout", "timed out, and went on"),
                ("children", "its child runs ended")], default="", max_length=20),
        ),
        AddIndexConcurrentlyOnPostgres(
            model_name="runstate",
            index=models.Index(fields=["parent_id"], name="run_state_parent_idx",
                               condition=Q(parent_id__isnull=False)),
        ),
    ]

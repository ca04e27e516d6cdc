# Runs that wait (durableruns.waits): the events sent to runs, approvals' decisions (one per approval's attempt),
# the resolutions of skipped and waited steps. The one index on a populated table (run_intervention) is built
# CONCURRENTLY on PostgreSQL, so the migration takes no long lock; the rest is a new table and choices.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


_INDEX = ("CREATE UNIQUE INDEX {concurrently} IF NOT EXISTS run_intervention_one_approval ON run_intervention "
          "(run_id, step, attempt) WHERE action IN ('approve', 'reject')")


# The claim's two probes on run_state (durableruns.store.claims), built CONCURRENTLY too: run_state is the busiest table.
_CLAIM_INDEXES = (
    "CREATE INDEX {concurrently} IF NOT EXISTS run_state_ready_idx ON run_state (priority DESC, created_at) "
    "WHERE status IN ('pending', 'running')",
    "CREATE INDEX {concurrently} IF NOT EXISTS run_state_wake_idx ON run_state (wake_at) WHERE status = 'waiting'",
)


def _concurrently(schema_editor):
    return "CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""


def _add_index(apps, schema_editor):
    schema_editor.execute(_INDEX.format(concurrently=_concurrently(schema_editor)))


def _drop_index(apps, schema_editor):
    schema_editor.execute("DROP INDEX IF EXISTS run_intervention_one_approval")


def _add_claim_indexes(apps, schema_editor):
    for statement in _CLAIM_INDEXES:
        schema_editor.execute(statement.format(concurrently=_concurrently(schema_editor)))


def _drop_claim_indexes(apps, schema_editor):
    for name in ("run_state_ready_idx", "run_state_wake_idx"):
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ('durableruns', '0014_run_state_priority_queue'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='RunEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('event', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, help_text="The sender's idempotency key: a second event with it is not recorded.", max_length=500, null=True)),
                ('payload', models.JSONField(default=dict)),
                ('sent_at', models.DateTimeField()),
                ('consumed_step', models.CharField(blank=True, default='', max_length=200)),
                ('consumed_attempt', models.PositiveIntegerField(blank=True, null=True)),
                ('consumed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'event',
                'db_table': 'run_event',
                'ordering': ['sent_at', 'id'],
                'permissions': [('send_event', 'Can send events to runs')],
            },
        ),
        migrations.AlterModelOptions(
            name='intervention',
            options={'ordering': ['-decided_at'], 'permissions': [('decide_approval', "Can approve or reject runs' approvals")]},
        ),
        migrations.AlterField(
            model_name='intervention',
            name='action',
            field=models.CharField(choices=[('happened', 'it happened'), ('did_not_happen', 'it did not happen, run it again'), ('abandon', 'abandon the run'), ('cancel', 'cancel the run'), ('retry', 'retry the failed step'), ('adopt_plan', 'move the run to the current plan'), ('approve', 'approve'), ('reject', 'reject')], max_length=20),
        ),
        migrations.AlterField(
            model_name='runstep',
            name='resolution',
            field=models.CharField(blank=True, choices=[('returned', 'the step returned'), ('lookup', 'resolved by lookup'), ('decision', 'decided by staff'), ('skipped', 'skipped: its when= said no'), ('event', 'an event sent to the run'), ('timer', 'its wake time came'), ('timeout', 'timed out, and went on')], default='', max_length=20),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name='intervention',
                    constraint=models.UniqueConstraint(condition=models.Q(('action__in', ['approve', 'reject'])), fields=('run', 'step', 'attempt'), name='run_intervention_one_approval'),
                ),
            ],
            database_operations=[migrations.RunPython(_add_index, _drop_index)],
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name='runstate',
                    index=models.Index(condition=models.Q(('status__in', ['pending', 'running'])), fields=['-priority', 'created_at'], name='run_state_ready_idx'),
                ),
                migrations.AddIndex(
                    model_name='runstate',
                    index=models.Index(condition=models.Q(('status', 'waiting')), fields=['wake_at'], name='run_state_wake_idx'),
                ),
            ],
            database_operations=[migrations.RunPython(_add_claim_indexes, _drop_claim_indexes)],
        ),
        migrations.AddField(
            model_name='runevent',
            name='run',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='durableruns.runstate'),
        ),
        migrations.AddIndex(
            model_name='runevent',
            index=models.Index(fields=['run', 'event', 'sent_at'], name='run_event_run_idx'),
        ),
        migrations.AddConstraint(
            model_name='runevent',
            constraint=models.UniqueConstraint(condition=models.Q(('key__isnull', False)), fields=('run', 'key'), name='run_event_key_once'),
        ),
    ]

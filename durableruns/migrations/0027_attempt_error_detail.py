"""A step's progress (ctx.progress: its latest message, done, total and when) and the last frames of what it
raised (error_detail), on its attempt's row (issue 33).

New nullable columns, and one with a database default: nothing is rewritten, and the hot path's raw inserts,
which do not name them, go on as they were.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durableruns", "0026_run_attribute"),
    ]

    operations = [
        migrations.AddField(
            model_name="runstep",
            name="progress_message",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runstep",
            name="progress_done",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runstep",
            name="progress_total",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runstep",
            name="progress_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="runstep",
            name="error_detail",
            field=models.TextField(
                blank=True,
                db_default="",
                default="",
                help_text="The last frames of the traceback of what the step raised (bounded), recorded with the "
                "error.",
            ),
        ),
    ]

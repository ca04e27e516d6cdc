"""Step rate limits (issue 35): run_rate_turn, the log of starts and given turns per (step, key).

A new, empty table: nothing is rewritten. After 0021 (held slots).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durableruns", "0021_held_slots_and_wake_order"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateTurn",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("step", models.CharField(max_length=200)),
                ("key", models.CharField(blank=True, default="", max_length=200)),
                ("at", models.DateTimeField(help_text="The start, or the moment a waiting run's turn comes.")),
                ("run_id", models.CharField(max_length=200)),
                ("started", models.BooleanField(default=False)),
            ],
            options={
                "verbose_name": "rate-limit turn",
                "db_table": "run_rate_turn",
                "ordering": ["step", "key", "at"],
                "indexes": [
                    models.Index(fields=["step", "key", "at"], name="run_rate_turn_bucket_idx"),
                    models.Index(fields=["run_id", "step"], name="run_rate_turn_run_idx"),
                ],
            },
        ),
    ]

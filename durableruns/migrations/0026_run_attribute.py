"""Run attributes (issue 32): run_attribute, the names and values a run is found by, deleted with its run.

A new, empty table: nothing is rewritten. After 0022 (rate turns); the lead relinks the chain at merge.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durableruns", "0025_run_state_deadline"),
    ]

    operations = [
        migrations.CreateModel(
            name="RunAttribute",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "run_id", "name", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        db_column="run_id",
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attributes",
                        to="durableruns.runstate",
                    ),
                ),
                ("name", models.CharField(max_length=50)),
                ("value_text", models.CharField(max_length=200)),
                (
                    "kind",
                    models.CharField(
                        default="s", help_text="s: a string; i: an integer (its decimal text)", max_length=1
                    ),
                ),
            ],
            options={
                "verbose_name": "run attribute",
                "db_table": "run_attribute",
                "indexes": [
                    models.Index(fields=["name", "value_text"], name="run_attribute_name_value_idx"),
                    models.Index(fields=["value_text"], name="run_attribute_value_idx"),
                ],
            },
        ),
    ]

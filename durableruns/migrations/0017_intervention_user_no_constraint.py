"""An intervention's user is kept by id, with no foreign key constraint and nothing done when the user is deleted.

The runs may live in a database of their own (DURABLERUNS_DATABASE) while the site's users stay in its default
one: a constraint cannot reach across, and Django's SET_NULL would look for interventions in the users' database
when one is deleted. A staff act is evidence, never edited afterwards; its decided_by keeps the name.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durableruns", "0016_run_state_unfinished_plan_idx"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="intervention",
            name="user",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                to=settings.AUTH_USER_MODEL,
            ),
        ),
    ]

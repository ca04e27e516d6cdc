"""An intervention's user is kept by id, with no foreign key constraint and nothing done when the user is deleted.

The runs may live in a database of their own (DURABLERUNS_DATABASE) while the site's users stay in its default
one: a constraint cannot reach across, and Django's SET_NULL would look for interventions in the users' database
when one is deleted. A staff act is evidence, never edited afterwards; its decided_by keeps the name.

0001 no longer makes the constraint (so migrating the runs' database needs no user table there); a database
migrated before still has it, and loses it here.
"""

import copy

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def drop_the_constraint_made_before(apps, schema_editor):
    intervention = apps.get_model("durableruns", "Intervention")
    user = intervention._meta.get_field("user")
    if not schema_editor._constraint_names(intervention, [user.column], foreign_key=True):
        return
    constrained = copy.copy(user)
    constrained.db_constraint = True
    schema_editor.alter_field(intervention, constrained, user)  # PostgreSQL drops it; SQLite remakes the table


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
        migrations.RunPython(drop_the_constraint_made_before, migrations.RunPython.noop),
    ]

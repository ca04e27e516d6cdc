from django.db import migrations, models


class Migration(migrations.Migration):
    # A nullable column with no default: PostgreSQL adds it without rewriting the table or holding its lock long.

    dependencies = [
        ('durableruns', '0010_run_step_absence_bound'),
    ]

    operations = [
        migrations.AddField(
            model_name='runstate',
            name='alerted_at',
            field=models.DateTimeField(blank=True, help_text="When the staff who may retry it were last e-mailed about it while it stood stopped for staff with no escalation (runs_health --alert), by the database's clock.", null=True),
        ),
    ]

# Two nullable columns: on PostgreSQL, adding them changes the catalogue only (no rewrite, a brief lock).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durableruns', '0009_run_state_ending_help'),
    ]

    operations = [
        migrations.AlterField(
            model_name='runstep',
            name='renewed_at',
            field=models.DateTimeField(blank=True, help_text="The last lease renewal while this attempt was in hand (the database's clock): the last moment its process was known alive.", null=True),
        ),
        migrations.AddField(
            model_name='runstep',
            name='held_until',
            field=models.DateTimeField(blank=True, help_text="The lease expiry its worker last held while this attempt was in hand (the database's clock): the last moment a lost worker could still have made its call.", null=True),
        ),
        migrations.AddField(
            model_name='runstep',
            name='raised_at',
            field=models.DateTimeField(blank=True, help_text="When the step raised in its live worker and was left in doubt (the database's clock): its call was over by then, so this bounds it instead of the lease.", null=True),
        ),
    ]

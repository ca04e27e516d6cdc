from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durableruns', '0012_run_state_trace_context'),
    ]

    operations = [
        migrations.CreateModel(
            name='ScheduleState',
            fields=[
                ('name', models.CharField(max_length=150, primary_key=True, serialize=False)),
                ('last_slot', models.DateTimeField(blank=True, help_text='The latest slot whose run was started.', null=True)),
                ('created_at', models.DateTimeField(help_text='When a worker first saw the schedule: its slots count from then.')),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'schedule',
                'db_table': 'run_schedule',
                'ordering': ['name'],
            },
        ),
    ]

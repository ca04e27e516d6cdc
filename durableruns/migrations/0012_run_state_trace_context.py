# A nullable column: PostgreSQL adds it without rewriting run_state or holding its lock for longer than the
# catalogue change.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('durableruns', '0011_run_state_alerted_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='runstate',
            name='trace_context',
            field=models.JSONField(blank=True, help_text="The trace context current when the run was started (OpenTelemetry's propagators' fields: traceparent, tracestate), so each pass over the run continues that trace. Recorded only with the [otel] extra installed and a span active; NULL otherwise.", null=True),
        ),
    ]

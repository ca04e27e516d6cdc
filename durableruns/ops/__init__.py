"""Operations around the record: retention, health checks, alerts, metrics and the admin dashboard.

Read-mostly and never on a worker's hot path; each module is one concern, and the management commands and the
admin call them.
"""

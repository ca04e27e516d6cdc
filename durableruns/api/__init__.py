"""The REST API (Django REST framework): runs, their boundaries, and the escalation queue, at /api/."""

from __future__ import annotations

"""Check durableruns' health for monitoring: one line per problem, exit 0 (ok), 1 (warning) or 2 (critical)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from durableruns.ops import alerts, health


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(text)
    return value


_seconds.__name__ = "seconds"

_WHAT = {
    "escalation": "an escalation open longer than this",
    "stopped": "a run stopped for staff with no escalation (crash budget spent, ...) longer than this",
    "due": "a run due (pending, waiting past its wake time, lease expired) longer than this",
    "stuck": "a run held this long past its step's timeout",
    "skew": "this host's clock this far from the database's",
}


class Command(BaseCommand):
    help = (
        "Report problems as monitoring plugins do: one line each, exit status 0 (all well), 1 (warning) or "
        "2 (critical). Checks: escalations left open, runs stopped for staff with no escalation, runs due with "
        "no worker taking them, runs stuck past "
        "their step's timeout, this host's clock against the database's. Ages are the database's clock."
    )

    def add_arguments(self, parser: Any) -> None:
        for check in health.CHECKS:
            for level in ("warning", "critical"):
                parser.add_argument(f"--{check}-{level}", type=_seconds, default=None, metavar="SECONDS",
                                    help=f"{level.capitalize()} at {_WHAT[check]} (default "
                                         f"DURABLERUNS_HEALTH_{check.upper()}_{level.upper()}_SECONDS).")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON instead.")
        parser.add_argument("--alert", action="store_true",
                            help="First e-mail the staff who may decide each escalation open longer than "
                                 "DURABLERUNS_ESCALATION_ALERT_SECONDS, and those who may retry each run stopped "
                                 "for staff with no escalation that long (at most once per that period); the "
                                 "summary goes to stderr (in the JSON, under \"alerts\").")

    def handle(self, *args: Any, json: bool, alert: bool, **options: Any) -> None:
        limits = {}
        for check in health.CHECKS:
            default = health.thresholds(check)
            warning, critical = options[f"{check}_warning"], options[f"{check}_critical"]
            limits[check] = health.Thresholds(
                warning=default.warning if warning is None else timedelta(seconds=warning),
                critical=default.critical if critical is None else timedelta(seconds=critical))
        try:
            sent = alerts.send_alerts() if alert else None
            report = health.check(limits=limits)
        except DatabaseError as exc:
            message = f"the database cannot be read: {exc}".strip()
            self.stdout.write(_json({"status": "critical", "exit": 2, "problems": [
                {"check": "database", "level": "critical", "message": message}]}) if json else
                f"CRITICAL database: {message}")
            raise CommandError("critical: the database cannot be read", returncode=2) from exc
        if sent is not None and not json:
            self.stderr.write(sent.summary())
        if json:
            data = report.as_dict()
            if sent is not None:
                data["alerts"] = {"summary": sent.summary(), "sent": [pk for pk, _ in sent.sent],
                                  "failed": [pk for pk, _ in sent.failed], "recipients": list(sent.recipients)}
                if sent.stopped is not None:
                    data["alerts"]["stopped_runs"] = {
                        "sent": [run for run, _ in sent.stopped.sent],
                        "failed": [run for run, _ in sent.stopped.failed],
                        "recipients": list(sent.stopped.recipients)}
            self.stdout.write(_json(data))
        else:
            for line in report.lines():
                self.stdout.write(line)
        if report.status:
            raise CommandError(f"{report.status.name.lower()}: {len(report.problems)} problem(s)",
                               returncode=int(report.status))


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)

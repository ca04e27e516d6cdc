"""System checks: declarations and settings that would fail a resume are reported at start-up, not on the day of a
crash.

Each is tagged TAG: resume_runs runs those (and the models' checks) at its start, rather than all of the site's
(see the command), and `manage.py check --tag durableruns` runs them alone.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, DatabaseError, models, router

from durableruns.policies import Policy
from durableruns.registry import not_loaded, startable_workflows, workflows

TAG = "durableruns"


@checks.register(TAG)
def check_workflows(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every workflow has steps; every resolvable step has a lookup (Workflow.step enforces policy itself)."""
    messages: list[checks.CheckMessage] = []
    for name, workflow in workflows().items():
        if not workflow.steps:
            messages.append(checks.Error(f"workflow {name!r} declares no steps", id="durableruns.E001"))
        for step in workflow.steps:
            if step.policy is Policy.RESOLVABLE and step.lookup is None:
                messages.append(checks.Error(f"{name}.{step.name} is resolvable but has no lookup",
                                             id="durableruns.E002"))
            if step.policy is Policy.ESCALATE and not step.doc:
                messages.append(checks.Warning(
                    f"{name}.{step.name} escalates but has no docstring",
                    hint="Staff read the docstring in the escalation queue: say how to check the far system by hand.",
                    id="durableruns.W002"))
            if step.released_by and step.released_by not in workflow.plan[workflow.plan.index(step.name) + 1:]:
                messages.append(checks.Error(
                    f"{name}.{step.name} is released_by {step.released_by!r}, which is not a later step of the plan",
                    hint="released_by names the later step whose completion gives the hold back (or consumes it).",
                    id="durableruns.E004"))
    return messages + _names_too_long()


def _names_too_long() -> list[checks.CheckMessage]:
    """Names the record cannot store, held to the models' own columns (Workflow.step refuses them at import;
    this catches a declaration that went round it). A run's claim would be refused by the database, run after
    run, for each such name."""
    from durableruns.models import Escalation, Intervention, RunPlan, RunState, RunStep

    def limit(*fields: tuple[type[models.Model], str]) -> int:
        columns = [model._meta.get_field(name) for model, name in fields]
        return min(column.max_length or 0 for column in columns if isinstance(column, models.Field))

    workflow_limit = limit((RunState, "workflow"), (RunPlan, "workflow"))
    step_limit = limit((RunStep, "step"), (Escalation, "step"), (Intervention, "step"))
    messages: list[checks.CheckMessage] = []
    for name, workflow in workflows().items():
        if len(name) > workflow_limit:
            messages.append(checks.Error(f"workflow {name[:40]!r}... has a {len(name)}-character name",
                                         hint=f"The record stores at most {workflow_limit}: rename it.",
                                         id="durableruns.E005"))
        for step in workflow.steps:
            recorded = [step.name] + ([step.releaser.name] if step.releaser is not None else [])
            for each in recorded:
                if len(each) > step_limit:
                    messages.append(checks.Error(
                        f"{name}.{each[:40]}... is recorded under a {len(each)}-character step name",
                        hint=f"The record stores at most {step_limit}: rename the step.", id="durableruns.E005"))
    return messages


@checks.register(TAG)
def check_discovery(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every module of workflows loaded (E030), and no workflows.py sits where none is imported (W005)."""
    from durableruns import discovery

    messages: list[checks.CheckMessage] = [
        checks.Error(f"{module} did not load: {message}",
                     hint="Its workflows are not registered, and no worker runs them: correct the declaration "
                          "(durableruns.errors.DeclarationError says what is wrong).",
                     id="durableruns.E030")
        for module, message in sorted(not_loaded().items())]
    messages += [
        checks.Warning(f"{path} is never imported: {package} is not an installed app",
                       hint=f"Move it into an app of INSTALLED_APPS (python manage.py startapp, then add the app), "
                            f"add {package!r} to INSTALLED_APPS if it is an app, or name {package}.workflows in "
                            f"DURABLERUNS_WORKFLOW_MODULES.",
                       id="durableruns.W005")
        for package, path in discovery.stray_workflows()]
    return messages


@checks.register(TAG)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every declared schedule names a workflow this deploy declares, and gives it an input it takes: otherwise
    its slots would never start."""
    from durableruns import schedules  # it reads the record's models, loaded by the time checks run

    known = startable_workflows()  # an internal workflow is not a schedule's to start
    messages: list[checks.CheckMessage] = [
        checks.Error(f"schedule {s.name!r} names workflow {s.workflow!r}, which is not declared",
                     hint="Declare the workflow in a workflows.py, or correct the schedule's workflow.",
                     id="durableruns.E023")
        for s in schedules.schedules() if s.workflow not in known]
    for declared in schedules.schedules():  # each rule the workflow holds the input to (schedules.INPUT_RULES)
        refused = schedules.input_refused(declared)
        if refused is not None:
            messages.append(checks.Error(
                f"schedule {declared.name!r}: {refused}",
                hint="Every slot's run would be refused, so none would start: correct the schedule's input, or "
                     "the workflow's concurrency_key.",
                id="durableruns.E024"))
    return messages


@checks.register(TAG)
def check_time_zone_support(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """USE_TZ = False is refused: durableruns compares instants, and naive local times are not instants.

    Leases run out, and a lagging lookup's "not found" becomes proof of absence, at instants compared with the
    database's timestamps. With USE_TZ = False Django hands out naive wall-clock times: they cannot be compared
    with the aware ones the database's JSON carries (a TypeError, and the run is never worked), and where the
    zone keeps daylight-saving time they jump by an hour, which would prove a step absent early and call the
    far system a second time. Refusing at start-up is safer than converting at every place two times meet.
    """
    if settings.USE_TZ:
        return []
    return [checks.Error(
        "durableruns needs USE_TZ = True",
        hint="Its leases and proofs of absence compare instants; naive local times (USE_TZ = False) cannot be "
             "compared with the database's timestamps, and jump at daylight-saving changes, so a step could be "
             "run twice. Set USE_TZ = True (Django's default); TIME_ZONE still sets how times are shown.",
        id="durableruns.E003")]


@checks.register(checks.Tags.database, TAG)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """SQLite has no row locks: fine for trying the app with one worker, not for several hosts."""
    from durableruns import conf

    if not kwargs.get("databases"):
        return []
    engine = settings.DATABASES.get(conf.database(), {}).get("ENGINE", "")
    if engine.endswith("sqlite3"):
        return [checks.Warning(
            "durableruns is running on SQLite",
            hint="SQLite serialises writers and has no SKIP LOCKED: use PostgreSQL before running resume_runs "
                 "from several workers or hosts.",
            id="durableruns.W001")]
    return []


@checks.register(checks.Tags.database, TAG)
def check_plans_in_flight(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn, before the old code is gone, of each step that runs in flight still need and this deploy lacks.

    A run follows the plan it started under; a deploy that removes or renames one of its steps (or declares it
    with another policy) leaves such runs waiting for a worker that has it, then stopped for staff. Run with
    `check --database default` in a deploy pipeline: the database is read only when asked to.
    """
    from durableruns import conf

    if not kwargs.get("databases") or conf.database() not in settings.DATABASES:  # E007 says why
        return []
    from durableruns import services  # the check reads the record: only with --database

    try:
        missing = services.missing_steps()
    except DatabaseError:  # not migrated yet: nothing can be in flight
        return []
    return [checks.Warning(
        f"{m.workflow}.{m.step} ({m.policy}) is missing from this deploy: {m.runs} active run(s) of plan "
        f"{m.fingerprint} still need it",
        hint="Keep the step (same name and policy) until those runs drain (the admin's runs list, by plan), "
             "or move each run to the current plan with durableruns.adopt_plan where its record fits. Meanwhile "
             "they wait for a worker that has the step, then stop for staff after "
             "DURABLERUNS_MISSING_STEP_GRACE_SECONDS.",
        id="durableruns.W003") for m in missing]


@checks.register(TAG)
def check_standby_intents(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """DURABLERUNS_STANDBY_INTENTS is a synchronous_commit level that waits for a standby, or unset."""
    from django.core.exceptions import ImproperlyConfigured

    from durableruns import conf

    try:
        conf.standby_intents()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="Leave it unset, or set 'on', 'remote_write' or 'remote_apply'.",
                             id="durableruns.E005")]
    return []


@checks.register(TAG)
def check_listen_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """DURABLERUNS_LISTEN_DATABASE names a database alias of the site (unset, it is the runs' own: E007's)."""
    alias = getattr(settings, "DURABLERUNS_LISTEN_DATABASE", None)
    if not alias or alias in settings.DATABASES:
        return []
    return [checks.Error(f"DURABLERUNS_LISTEN_DATABASE names {alias!r}, which is not in DATABASES",
                         hint="Name the alias of a direct connection to the runs' PostgreSQL, or leave it unset.",
                         id="durableruns.E006")]


ROUTER = "durableruns.routers.DurableRunsRouter"


@checks.register(TAG)
def check_own_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """DURABLERUNS_DATABASE names a database alias of the site, and DurableRunsRouter sends the app's queries there.

    Without the router the engine's own statements go to that alias while Django's (the admin's, the API's,
    migrate's) go to "default": two halves of one record in two databases.
    """
    from durableruns import conf
    from durableruns.routers import DurableRunsRouter

    alias = conf.database()
    if alias not in settings.DATABASES:
        return [checks.Error(f"DURABLERUNS_DATABASE names {alias!r}, which is not in DATABASES",
                             hint='Name the alias of the database that holds the runs, or leave it unset ("default").',
                             id="durableruns.E007")]
    if alias != DEFAULT_DB_ALIAS and not any(isinstance(r, DurableRunsRouter) for r in router.routers):
        return [checks.Warning(
            f"DURABLERUNS_DATABASE is {alias!r} but {ROUTER} is not in DATABASE_ROUTERS",
            hint="Add it, so that Django's own queries of durableruns' models (the admin, the API, migrate) go to "
                 "the same database as the engine's.",
            id="durableruns.W004")]
    return []


@checks.register(TAG)
def check_workflow_groups(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """DURABLERUNS_WORKFLOW_GROUPS is a dict of workflow name to group names (E032), and each workflow it scopes
    is declared (W006: a misspelt name scopes nothing, and the runs it meant to keep apart are seen by all)."""
    from django.core.exceptions import ImproperlyConfigured

    from durableruns import conf

    try:
        scoped = conf.workflow_groups()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint='For example {"payroll": ["Payroll"]}: a workflow\'s name, then the '
                                            "names of the groups whose members see its runs.",
                             id="durableruns.E032")]
    declared = workflows()
    return [checks.Warning(
        f"DURABLERUNS_WORKFLOW_GROUPS scopes {name!r}, which no workflow is declared as",
        hint=f"Its runs, if any, are seen by everyone the model permissions admit. Declared: "
             f"{', '.join(sorted(declared)) or 'none'}.",
        id="durableruns.W006") for name in sorted(scoped) if name not in declared]


@checks.register(TAG)
def check_bulk_share(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """DURABLERUNS_BULK_SHARE is a share of a worker's time: above 0, at most 1 (E033)."""
    from django.core.exceptions import ImproperlyConfigured

    from durableruns import conf

    try:
        conf.bulk_share()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint="0.5 (the default) lets a bulk take half of its thread's time; 1, all.",
                             id="durableruns.E033")]
    return []

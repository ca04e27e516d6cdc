"""The backend for Django's Tasks: `TASKS = {"default": {"BACKEND": "durableruns.tasks.DurableRunsBackend"}}`.

A thin adapter from the Tasks API to runs. `my_task.enqueue(...)` starts a run of one workflow, "durableruns.task",
whose one re-executable step calls the task recorded in the run's input (its module path, args and kwargs), looked
up by that path on the worker that claims the run: the worker's deploy supplies the task's code, as it supplies
every step's. The engine drives it like any run (lease, fencing, crash budget, retries with backoff, the admin);
`get_result(id)` reads the run's record back as a TaskResult.

The workflow is internal (Workflow(..., internal=True)): only enqueue() starts it; durableruns.start, the API, a
child run and a schedule refuse it as an unknown name. And the input names code, so the step trusts it no further
than this: the path must lead to a Task object of this site (`@task`), declared at that very path, whose backend
is a durableruns one. Anything else (a bare function, a Task of another backend, a path that does not import) fails
the run as a rejection, having run nothing. get_result() resolves the path the same way and otherwise reports the
record under a stand-in task (result_of).

On Django 6 this is `django.tasks`; on Django 5.2 the `django-tasks` backport (durableruns[tasks]).
"""

from __future__ import annotations

import traceback
import uuid
from datetime import datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from durableruns import conf, services, store
from durableruns.context import StepContext
from durableruns.errors import Rejected, ResultNotJSON
from durableruns.models import RunState, RunStatus, RunStep, StepStatus
from durableruns.registry import Workflow

try:  # Django 6
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.base import (  # type: ignore[no-redef,assignment,unused-ignore]
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef,assignment,unused-ignore]
    from django_tasks.signals import (  # type: ignore[no-redef,assignment,unused-ignore]
        task_enqueued,
        task_finished,
        task_started,
    )

BACKEND = "durableruns.tasks.DurableRunsBackend"
WORKFLOW = "durableruns.task"
# What the error of a failed attempt keeps of the task's traceback: its last lines, where the cause is.
TRACEBACK_LIMIT = 1500


def _max_attempts() -> int:
    """OPTIONS["MAX_ATTEMPTS"] of the TASKS alias that uses this backend (default 1: a task that raises has
    failed, as the Tasks API has it); above 1, a task that raises is retried with DURABLERUNS' backoff."""
    for params in getattr(settings, "TASKS", {}).values():
        if params.get("BACKEND") == BACKEND:
            return int(params.get("OPTIONS", {}).get("MAX_ATTEMPTS", 1))
    return 1


# Internal: started only by DurableRunsBackend.enqueue, which passes this object to services.start_run.
tasks = Workflow(WORKFLOW, internal=True)


def task_at(path: Any) -> Task | None:
    """The Task object of this site declared at `path` (a module path such as "shop.tasks.send_mail") whose
    backend (an alias of TASKS) is a durableruns backend; None for anything else: a bare callable, a Task found
    at another path (an alias), a Task of another backend, a path that does not import.

    The path comes from a run's record: it is imported as Django's own backends import a task's path, and what it
    leads to is never called unless it passes these tests."""
    if not isinstance(path, str) or "." not in path:
        return None
    try:
        found = import_string(path)
    except ImportError:  # import_string's answer for a missing module and for a missing name alike
        return None
    if not isinstance(found, Task) or found.module_path != path or not is_ours(found.backend):
        return None
    return found


def is_ours(alias: Any) -> bool:
    """Whether the TASKS alias names this backend (or a subclass of it)."""
    params = getattr(settings, "TASKS", {}).get(alias) if isinstance(alias, str) else None
    if not isinstance(params, dict) or not isinstance(params.get("BACKEND"), str):
        return False
    if params["BACKEND"] == BACKEND:
        return True
    try:
        backend = import_string(params["BACKEND"])  # the site's settings: trusted as every setting is
    except ImportError:
        return False
    return isinstance(backend, type) and issubclass(backend, DurableRunsBackend)


class TaskRaised(Exception):
    """The task raised: the exception's class path and its traceback, as the failed attempt records them."""

    def __init__(self, exception_class_path: str, traceback_text: str) -> None:
        super().__init__(f"{exception_class_path}\n{traceback_text}")
        self.exception_class_path = exception_class_path
        self.traceback_text = traceback_text


@tasks.step(policy="re_executable", max_attempts=_max_attempts())
def run_task(ctx: StepContext) -> Any:
    """Call the task the run records, with its args and kwargs; what it returns is the task's return value.

    Sends the Tasks API's task_started before the call and task_finished after it (SUCCESSFUL, or FAILED with
    the error, from inside the handler as Django's own backends do), once per attempt: a task retried under
    MAX_ATTEMPTS, or run again after its worker died, is started (and finished) again. The TaskResult they carry
    is this attempt's, made in memory (no read of the record on the hot path); get_result() reads the record.

    A run whose input does not name a Task of this site's durableruns backend (task_at), or names another
    backend's alias, fails at once (Rejected: an observed refusal, not retried, not in doubt) and calls nothing:
    only enqueue() records these runs, so such an input was written by something else."""
    path, alias = ctx.input.get("task"), ctx.input.get("backend")
    found = task_at(path)
    if found is None or not is_ours(alias):
        raise Rejected(
            f"not run: the run's input names {path!r} on backend {alias!r}, which is not a task of this "
            f"site's durableruns backend (a Task object at that module path, whose backend is durableruns); "
            f"only Task.enqueue() records task runs"
        )
    task = found.using(backend=alias)
    args, kwargs = list(ctx.input.get("args", [])), dict(ctx.input.get("kwargs", {}))
    if task.takes_context:
        args.insert(0, TaskContext(task_result=result_of(ctx.run_id)))
    attempt = _attempt_result(ctx, task)
    task_started.send(DurableRunsBackend, task_result=attempt)
    try:
        returned = task.call(*args, **kwargs)
        _json_or_type_error(returned)
    # The task's own, re-raised with its traceback, for get_result (errors). SystemExit (a task calling exit())
    # and KeyboardInterrupt raised by the task are its failure too, as Django's worker backends record them:
    # caught only around this call, so they never reach the worker. The worker's own SIGINT and SIGTERM do not
    # raise (resume_runs handles them: stop claiming, finish the steps in hand), so nothing of the worker's
    # shutdown is taken for a task's failure.
    except (Exception, SystemExit, KeyboardInterrupt) as exc:
        kind = type(exc)
        text = "".join(traceback.format_exception(exc))
        path = f"{kind.__module__}.{kind.__qualname__}"
        attempt.errors.append(TaskError(exception_class_path=path, traceback=text))
        _ended(attempt, TaskResultStatus.FAILED)
        task_finished.send(DurableRunsBackend, task_result=attempt)
        if len(text) > TRACEBACK_LIMIT:
            text = f"Traceback (cut to its last {TRACEBACK_LIMIT} characters):\n...{text[-TRACEBACK_LIMIT:]}"
        raise TaskRaised(path, text) from exc
    object.__setattr__(attempt, "_return_value", returned)
    _ended(attempt, TaskResultStatus.SUCCESSFUL)
    task_finished.send(DurableRunsBackend, task_result=attempt)
    return returned


def _json_or_type_error(value: Any) -> None:
    """Refuse a return value the record cannot hold with a TypeError, raised inside the task's call: the task has
    failed with a TypeError, as Django's backends record one (not durableruns' own ResultNotJSON)."""
    try:
        store.to_json(value, what="the task's return value")
    except ResultNotJSON as exc:
        raise TypeError(f"Unsupported type: {exc}") from None


def _attempt_result(ctx: StepContext, task: Task) -> Any:
    """The TaskResult of the attempt starting now, for the task_started and task_finished signals."""
    now = timezone.now()
    return TaskResult(
        task=task,
        id=ctx.run_id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(ctx.input.get("args", [])),
        kwargs=dict(ctx.input.get("kwargs", {})),
        backend=ctx.input.get("backend", ""),
        errors=[],
        worker_ids=[],
    )


def _ended(attempt: Any, status: Any) -> None:
    object.__setattr__(attempt, "status", status)
    object.__setattr__(attempt, "finished_at", timezone.now())


class DurableRunsBackend(BaseTaskBackend):
    """Django's Tasks on durableruns: each enqueued task is a run that `manage.py resume_runs` works.

    OPTIONS: "ENQUEUE_ON_COMMIT" (default False: the run is recorded in the caller's transaction, so it exists
    exactly when the caller's own records do; True: recorded once that transaction commits, as a separate
    commit) and "MAX_ATTEMPTS" (default 1).
    """

    supports_defer = True
    supports_priority = True
    supports_async_task = True
    supports_get_result = True

    def check(self, **kwargs: Any) -> Any:
        """The backend's system checks (Django's tasks checks ask every configured backend): its runs live in
        durableruns' tables, so the app must be installed."""
        yield from super().check(**kwargs)
        if not apps.is_installed("durableruns"):
            yield checks.Error(
                f"{BACKEND} is the backend of TASKS[{self.alias!r}], but durableruns is not in INSTALLED_APPS",
                hint="Add 'durableruns' to INSTALLED_APPS: task runs are durableruns runs, in its tables.",
                id="durableruns.E031",
            )

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Record a run of the task with these args and kwargs; return its TaskResult (READY).

        Its enqueued_at is the database's time the run was recorded at (run_state.created_at), so it equals what
        get_result() reads. With ENQUEUE_ON_COMMIT inside a transaction the run is recorded only once that
        transaction commits: until then enqueued_at is None (there is no run yet, and a rolled-back caller never
        has one); the commit records it and sets enqueued_at on this same result, before task_enqueued is sent."""
        self.validate_task(task)
        run_id = f"{task.name[:100]}-{uuid.uuid4().hex}"
        result: Any = TaskResult(
            task=task,
            id=run_id,
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        recorded = {
            "task": task.module_path,
            "args": result.args,
            "kwargs": result.kwargs,
            "backend": self.alias,
            "run_after": task.run_after.isoformat() if task.run_after is not None else None,
        }

        def record() -> None:
            services.start_run(
                WORKFLOW,
                recorded,
                internal=tasks,  # the only start of this internal workflow
                run_id=run_id,
                priority=task.priority,
                queue=task.queue_name,
                run_after=task.run_after,
            )
            # The database's time the run was recorded at (run_state.created_at), read back: what get_result()
            # says, to the microsecond, and what the claim orders equal priorities by.
            created = RunState.objects.filter(pk=run_id).values_list("created_at", flat=True).first()
            object.__setattr__(result, "enqueued_at", created)
            task_enqueued.send(type(self), task_result=result)

        # ENQUEUE_ON_COMMIT waits for the caller's transaction: the site's own (on "default") if one is open, else
        # one on the runs' database. Without it a task joins a transaction open on the runs' database only.
        waiting = [
            alias for alias in dict.fromkeys((DEFAULT_DB_ALIAS, conf.database())) if connections[alias].in_atomic_block
        ]
        if self.options.get("ENQUEUE_ON_COMMIT", False) and waiting:
            transaction.on_commit(record, using=waiting[0])
        else:
            record()
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as its run's record has it; TaskResultDoesNotExist if there is no such task run."""
        return result_of(result_id)


def result_of(run_id: str) -> TaskResult:
    """Read a task's run back as a TaskResult: status, times, the workers that attempted it, its return value
    or the errors of its failed attempts."""
    run = RunState.objects.filter(pk=run_id, workflow=WORKFLOW).first()
    if run is None:
        raise TaskResultDoesNotExist(run_id)
    attempts = list(RunStep.objects.of_run(run_id).filter(step="run_task"))
    found = task_at(run.input.get("task"))
    alias = run.input.get("backend")
    task: Task
    if found is None or not is_ours(alias):
        # Not a task of this site's backend (a record enqueue did not write, or a task since removed): its path
        # is not imported further and nothing of it is called. The result still says what the record holds,
        # under the stand-in task `unresolved_task`, whose call refuses to run.
        task = Task(func=unresolved_task, backend=alias if is_ours(alias) else _our_alias())
    else:
        task = found.using(
            priority=run.priority,
            queue_name=run.queue,
            backend=alias,
            run_after=datetime.fromisoformat(run.input["run_after"]) if run.input.get("run_after") else None,
        )
    finished = run.status in _FINISHED
    result: Any = TaskResult(
        task=task,
        id=run.run_id,
        status=_STATUS.get(run.status, TaskResultStatus.RUNNING),  # type: ignore[call-overload,unused-ignore]
        enqueued_at=run.created_at,
        started_at=attempts[0].started_at if attempts else None,
        finished_at=_finished_at(run, attempts) if finished else None,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        args=run.input.get("args", []),
        kwargs=run.input.get("kwargs", {}),
        backend=run.input.get("backend", ""),
        errors=[_error(a.error) for a in attempts if a.status == StepStatus.FAILED],
        worker_ids=[a.owner for a in attempts],
    )
    done = next((a for a in attempts if a.status == StepStatus.COMPLETED), None)
    if done is not None:
        object.__setattr__(result, "_return_value", done.result)
    return result


def unresolved_task(*args: Any, **kwargs: Any) -> None:
    """The stand-in of get_result() for a task run whose recorded path is not a task of this site's durableruns
    backend: the TaskResult carries the record (status, times, args, errors) and this task, never an object
    imported from the record's path; calling it runs nothing."""
    raise Rejected("this task run's recorded path is not a task of this site's durableruns backend")


def _our_alias() -> str:
    """The first TASKS alias naming a durableruns backend (get_result is asked of one, so there is one)."""
    return next((alias for alias in getattr(settings, "TASKS", {}) if is_ours(alias)), "default")


# A run waiting (deferred, or for a retry's backoff) will run again: READY. One stopped for staff (its crash
# budget spent) is neither finished nor ready: RUNNING until staff settle it.
_STATUS = {
    RunStatus.PENDING: TaskResultStatus.READY,
    RunStatus.WAITING: TaskResultStatus.READY,
    RunStatus.RUNNING: TaskResultStatus.RUNNING,
    RunStatus.NEEDS_DECISION: TaskResultStatus.RUNNING,
    RunStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    RunStatus.FAILED: TaskResultStatus.FAILED,
    RunStatus.CANCELLED: TaskResultStatus.FAILED,
}
_FINISHED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


def _finished_at(run: RunState, attempts: list[RunStep]) -> datetime:
    ends = [a.finished_at for a in attempts if a.finished_at is not None]
    return max(ends) if ends else run.updated_at


def _error(text: str) -> TaskError:
    """A failed attempt's error as a TaskError: what TaskRaised recorded ("<its path>: <class path>\\n<traceback>"),
    or, for a failure of durableruns' own (a return value that is not JSON), its first line's class."""
    head, _, rest = text.partition("\n")
    kind, _, message = head.partition(": ")
    if kind == f"{TaskRaised.__module__}.{TaskRaised.__qualname__}" and rest:
        # The record keeps the error stripped (engine._describe); a traceback ends with its newline, as
        # traceback.format_exception gives it and Django's backends store it.
        return TaskError(exception_class_path=message, traceback=rest if rest.endswith("\n") else rest + "\n")
    return TaskError(exception_class_path=kind, traceback=text)

"""Declaring workflows: the fixed interface, its errors, and the plan fingerprint."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest

from durableruns import Rejected, Workflow, registry
from durableruns.errors import DeclarationError, UnknownWorkflow
from durableruns.policies import Policy
from durableruns.registry import get_workflow

ROOT = Path(__file__).resolve().parents[2]


def test_steps_run_in_declaration_order_and_are_named_by_function():
    wf = Workflow("unit_order")

    @wf.step(policy="re_executable")
    def parse_request(ctx): ...

    @wf.step(policy="resolvable", lookup=lambda ctx: None, lookup_lag=timedelta(seconds=60),
             timeout=timedelta(seconds=30), max_attempts=5, fails_on=ValueError)
    def charge(ctx): ...

    assert wf.plan == ("parse_request", "charge")
    assert get_workflow("unit_order") is wf
    step = wf["charge"]
    assert step.policy is Policy.RESOLVABLE and step.max_attempts == 5
    assert step.is_rejection(ValueError()) and step.is_rejection(Rejected()) and not step.is_rejection(OSError())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "sometimes"}, "policy must be one of"),
        ({"policy": "resolvable"}, "needs lookup"),
        ({"policy": "escalate", "intent": False}, "only a re_executable step"),
        ({"policy": "re_executable", "max_attempts": 0}, "at least 1"),
    ],
)
def test_bad_declarations_are_refused_at_import(kwargs, message):
    wf = Workflow("unit_bad")
    with pytest.raises(DeclarationError, match=message):
        wf.step(**kwargs)


def test_policy_is_required():
    wf = Workflow("unit_required")
    with pytest.raises(TypeError):
        wf.step()  # type: ignore[call-arg]


def test_a_step_name_is_declared_once():
    wf = Workflow("unit_twice")

    @wf.step(policy="re_executable")
    def a(ctx): ...

    with pytest.raises(DeclarationError, match="declared twice"):
        wf.step(policy="re_executable")(a)


def test_fingerprint_changes_with_order_and_policy_only():
    def build(name, policies):
        wf = Workflow(name)
        for step, policy in policies:
            fn = lambda ctx: None  # noqa: E731
            fn.__name__ = step
            wf.step(policy=policy, lookup=(lambda ctx: None) if policy == "resolvable" else None)(fn)
        return wf.fingerprint

    base = build("fp1", [("a", "re_executable"), ("b", "escalate")])
    assert build("fp2", [("a", "re_executable"), ("b", "escalate")]) == base
    assert build("fp3", [("b", "escalate"), ("a", "re_executable")]) != base
    assert build("fp4", [("a", "re_executable"), ("b", "resolvable")]) != base
    assert build("fp5", [("a", "re_executable")]) != base


def test_unknown_workflow_names_the_known_ones():
    with pytest.raises(UnknownWorkflow, match="no workflow named 'nope'"):
        get_workflow("nope")


def test_first_steps_names_each_workflow_whose_first_step_records_an_intent():
    from durableruns.registry import first_steps

    records = Workflow("unit_first_records")
    quiet = Workflow("unit_first_quiet")

    @records.step(policy="escalate")
    def call(ctx): ...

    assert ("unit_first_records", records.fingerprint, "call") in first_steps()

    @records.step(policy="re_executable")
    def after(ctx): ...

    # A new step changes the fingerprint, and what the claim is told changes with it.
    assert ("unit_first_records", records.fingerprint, "call") in first_steps()

    @quiet.step(policy="re_executable", intent=False)
    def pure(ctx): ...

    assert not any(name == "unit_first_quiet" for name, _, _ in first_steps())


# -- a workflow's name belongs to one module ------------------------------------------------------------------

DECLARES_SHIPPING = '''
from durableruns import Workflow

shipping = Workflow("unit_shipping"{extra})


@shipping.step(policy="re_executable")
def {step}(ctx):
    return {{"by": __name__}}
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write modules into a folder on sys.path and import them; the registry is restored afterwards."""
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def declare(module: str, *, step: str = "book", extra: str = "") -> ModuleType:
        (tmp_path / f"{module}.py").write_text(DECLARES_SHIPPING.format(step=step, extra=extra))
        written.append(module)
        importlib.invalidate_caches()
        if module in sys.modules:
            return importlib.reload(sys.modules[module])
        return importlib.import_module(module)

    yield declare
    for module in written:
        sys.modules.pop(module, None)


def test_two_modules_declaring_one_name_is_an_error_naming_the_name_and_both_modules(modules):
    first = modules("unit_shop_a")
    with pytest.raises(DeclarationError) as refused:
        modules("unit_shop_b", step="ship")
    message = str(refused.value)
    assert "'unit_shipping' is declared twice: in unit_shop_a and in unit_shop_b" in message
    assert refused.value.modules == ("unit_shop_a", "unit_shop_b")
    # The first declaration stands: runs started under it go on executing its own steps.
    assert get_workflow("unit_shipping") is first.shipping and first.shipping.plan == ("book",)
    assert first.shipping.module == "unit_shop_a"


def test_the_same_module_imported_again_replaces_its_own_declaration(modules):
    before = modules("unit_shop_a").shipping
    again = modules("unit_shop_a", step="ship").shipping  # importlib.reload, as a test or a dev server does
    assert again is not before and get_workflow("unit_shipping") is again and again.plan == ("ship",)


def test_a_declaration_with_replace_true_replaces_one_from_another_module(modules):
    modules("unit_shop_a")
    other_deploy = modules("unit_shop_v2", step="ship", extra=", replace=True").shipping
    assert get_workflow("unit_shipping") is other_deploy and other_deploy.module == "unit_shop_v2"


def test_a_subclass_of_workflow_is_declared_by_the_module_that_instantiates_it(modules, monkeypatch):
    class Audited(Workflow):
        def __init__(self, name: str) -> None:
            super().__init__(name)

    monkeypatch.setattr("durableruns.Workflow", Audited)
    assert modules("unit_shop_a").shipping.module == "unit_shop_a"
    with pytest.raises(DeclarationError, match="in unit_shop_a and in unit_shop_b"):
        modules("unit_shop_b")


def test_django_refuses_to_start_when_two_modules_declare_one_workflow_name(tmp_path):
    """The second declaration raises during AppConfig.ready (autodiscovery): manage.py check stops, saying both,
    as a system check's error (E030), not a traceback."""
    (tmp_path / "unit_rival_purchasing.py").write_text(
        'from durableruns import Workflow\n\npurchase_order = Workflow("purchase_order")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               DJANGO_SETTINGS_MODULE="project.settings", DURABLERUNS_WORKFLOW_MODULES="unit_rival_purchasing")
    env.pop("DATABASE_URL", None)  # the check needs no database: start-up fails before any is used
    refused = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0
    assert ("(durableruns.E030) unit_rival_purchasing did not load: workflow 'purchase_order' is declared twice: "
            "in project.purchasing.workflows and in unit_rival_purchasing") in refused.stderr
    assert "Traceback" not in refused.stderr
    fine = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(env, DURABLERUNS_WORKFLOW_MODULES="tests.faults.deploy_v2"))
    assert fine.returncode == 0, fine.stderr  # a deploy that replaces purchase_order on purpose still starts


def test_a_name_the_record_cannot_store_is_refused_at_declaration():
    wf = Workflow("unit_long_names")

    def fits(ctx): ...

    def too_long(ctx): ...

    def give_back(ctx): ...

    fits.__name__ = "s" * registry.NAME_LIMIT
    wf.step(policy="re_executable")(fits)  # exactly as long as run_step.step holds
    too_long.__name__ = "t" * 250
    with pytest.raises(DeclarationError, match="at most 200") as raised:
        wf.step(policy="re_executable")(too_long)
    assert raised.value.step == too_long.__name__
    too_long.__name__ = "r" * 195  # fits, but its release is recorded as "<step>:release": 203 characters
    with pytest.raises(DeclarationError, match="203 characters long"):
        wf.step(policy="re_executable", release=give_back)(too_long)
    with pytest.raises(DeclarationError, match="250-character name"):
        Workflow("w" * 250)
    assert wf.plan == (fits.__name__,)
    registry._registry.pop("unit_long_names")


def test_a_name_that_went_round_the_declaration_is_a_system_check_error():
    from durableruns.checks import check_workflows
    from tests.factories import declare_unchecked

    wf = Workflow("unit_long_unchecked")

    def too_long(ctx): ...

    too_long.__name__ = "u" * 250
    declare_unchecked(wf, too_long)
    try:
        [error] = [m for m in check_workflows() if m.id == "durableruns.E005"]
        assert error.msg.startswith(f"unit_long_unchecked.{'u' * 40}... is recorded under a 250-character")
    finally:
        registry._registry.pop("unit_long_unchecked")
    assert not [m for m in check_workflows() if m.id == "durableruns.E005"]


@pytest.mark.parametrize("bad", [{"concurrency": 0}, {"concurrency": -2}, {"concurrency": True},
                                 {"concurrency": 1.5}, {"concurrency_key": "buyer"}])
def test_a_non_positive_limit_or_a_key_that_is_not_a_function_is_refused(bad):
    with pytest.raises(DeclarationError):
        Workflow("badly_limited", **bad)


def test_a_limit_records_its_key_as_a_string_and_defaults_to_one_per_key(monkeypatch):
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))  # restored afterwards
    assert Workflow("limit_free").limit_key({"buyer": 7}) is None
    assert Workflow("limit_whole", concurrency=4).limit_key({"buyer": 7}) == ""
    keyed = Workflow("limit_keyed", concurrency_key=lambda input: input["buyer"])
    assert keyed.concurrency == 1 and keyed.limit_key({"buyer": 7}) == "7"


def manage(tmp_path: Path, *args: str, modules: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
               DJANGO_SETTINGS_MODULE="project.settings", DURABLERUNS_WORKFLOW_MODULES=modules,
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_declaration_error_is_a_system_check_error_and_commands_stop_with_its_message(tmp_path):
    """A workflows module that raises DeclarationError does not kill every command at import: check and
    resume_runs stop with E030 naming the module and the message; a command that runs no checks still starts, and
    starting the module's workflow says why it is unknown."""
    (tmp_path / "unit_broken_flows.py").write_text(
        'from durableruns import Workflow\n\nbroken = Workflow("unit_broken")\n\n\n'
        '@broken.step(policy="resolvable")\ndef charge(ctx):\n    return {}\n')
    said = "unit_broken_flows did not load: unit_broken: a resolvable step needs lookup=, a function of ctx"
    for command in (["check"], ["resume_runs", "--once"]):
        stopped = manage(tmp_path, *command, modules="unit_broken_flows")
        assert stopped.returncode == 1, stopped.stdout + stopped.stderr
        assert f"(durableruns.E030) {said}" in stopped.stderr and "Traceback" not in stopped.stderr
    shell = manage(tmp_path, "shell", "-c", "import durableruns\ntry:\n    durableruns.start('unit_broken', {})\n"
                   "except durableruns.errors.UnknownWorkflow as exc:\n    print(exc)", modules="unit_broken_flows")
    assert f"{said} (manage.py check reports it: durableruns.E030)" in shell.stdout, shell.stderr
    fine = manage(tmp_path, "check", modules="")
    assert fine.returncode == 0 and "E030" not in fine.stderr, fine.stderr


def test_a_workflows_py_outside_an_installed_app_is_a_warning_naming_where_to_move_it(tmp_path, settings):
    """startproject's package (beside settings.py) and an app made by startapp but not installed: their
    workflows.py is never imported, and check says so (W005); the demo's own layout has none."""
    from durableruns.checks import check_discovery

    assert [m.id for m in check_discovery()] == []
    for package, marker in (("unit_mysite", "settings.py"), ("unit_shop", "apps.py"), ("unit_notes", "")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "workflows.py").write_text("")
        if marker:
            (tmp_path / package / marker).write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        settings.ROOT_URLCONF = "unit_mysite.urls"
        messages = check_discovery()
    finally:
        sys.path.remove(str(tmp_path))
    assert [(m.id, m.msg) for m in messages] == [
        ("durableruns.W005", f"{tmp_path / 'unit_mysite' / 'workflows.py'} is never imported: unit_mysite is not "
                             f"an installed app"),
        ("durableruns.W005", f"{tmp_path / 'unit_shop' / 'workflows.py'} is never imported: unit_shop is not an "
                             f"installed app"),
    ]  # unit_notes looks like no app: a folder of its own, not reported
    assert "startapp" in messages[0].hint and "INSTALLED_APPS" in messages[0].hint


def test_no_workflow_known_says_where_workflows_py_must_be():
    message = registry._unknown("fulfil", {})
    assert message.startswith("no workflow named 'fulfil' is registered (known: none). No workflows.py declared one")
    assert "INSTALLED_APPS" in message and "durableruns.W005" in message

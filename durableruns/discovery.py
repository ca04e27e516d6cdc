"""Finding the site's workflows at start-up: each installed app's workflows.py and the modules named in
DURABLERUNS_WORKFLOW_MODULES, imported by the AppConfig's ready().

A module that declares a workflow wrongly raises DeclarationError while it is imported. Raised from ready(), it
would end every command of the site (check, migrate, shell) with a traceback; instead it is recorded
(registry.record_not_loaded), system check durableruns.E030 reports it with its module and message, and the
commands that run checks (resume_runs, runserver, check) stop there with that message. The site's other modules
load as usual.

A workflows.py that is not in an installed app is never imported: `stray_workflows()` finds the likely places
(the project package beside the settings module, a folder made by startapp and not added to INSTALLED_APPS),
for system check durableruns.W005.
"""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.utils.module_loading import module_has_submodule

from durableruns.errors import DeclarationError
from durableruns.registry import record_not_loaded


def discover() -> None:
    """Import each installed app's workflows.py, then each module DURABLERUNS_WORKFLOW_MODULES names."""
    for app in apps.get_app_configs():
        if module_has_submodule(app.module, "workflows"):
            _load(f"{app.name}.workflows")
    for module in getattr(settings, "DURABLERUNS_WORKFLOW_MODULES", ()):
        _load(module)


def _load(module: str) -> None:
    try:
        import_module(module)
    except DeclarationError as exc:
        sys.modules.pop(module, None)  # half run: a later import would skip the rest of its declarations
        record_not_loaded(module, str(exc))


def stray_workflows() -> list[tuple[str, Path]]:
    """(package, its workflows.py) for each workflows.py found where durableruns does not look: in the packages of
    the settings module and of ROOT_URLCONF, and in the folders beside them that look like an app (an apps.py or
    a models.py) but are not installed. One imported all the same (DURABLERUNS_WORKFLOW_MODULES) is not stray."""
    installed = {Path(app.path).resolve() for app in apps.get_app_configs()}
    packages: dict[str, Path] = {}
    for dotted in (getattr(settings, "SETTINGS_MODULE", None), getattr(settings, "ROOT_URLCONF", None)):
        package = (dotted or "").rpartition(".")[0]
        spec = find_spec(package) if package else None
        if spec is None or not spec.submodule_search_locations:
            continue
        home = Path(next(iter(spec.submodule_search_locations))).resolve()
        packages[package] = home
        prefix = package.rpartition(".")[0]
        for sibling in home.parent.iterdir():
            if sibling.is_dir() and ((sibling / "apps.py").exists() or (sibling / "models.py").exists()):
                packages.setdefault(f"{prefix}.{sibling.name}" if prefix else sibling.name, sibling.resolve())
    return [
        (package, home / "workflows.py")
        for package, home in sorted(packages.items())
        if (home / "workflows.py").exists() and home not in installed and f"{package}.workflows" not in sys.modules
    ]

"""durableruns' own Sphinx extension: the management commands' options read from their parsers, and checks that
the reference names everything the code has (a setting, a command option, a signal, a metric, an API operation,
a public function). A gap is a warning, so the build with -W fails until a page names it.
"""

from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx
from sphinx.util import logging

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "durableruns"

# Options every Django command has; the pages list each command's own.
DJANGO_OPTIONS = {
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def command_parser(name: str) -> Any:
    """The argument parser of durableruns' management command `name`, without Django's common options."""
    command = import_module(f"durableruns.management.commands.{name}").Command()
    parser = command.create_parser("manage.py", name)
    for action in list(parser._actions):
        if action.dest in DJANGO_OPTIONS:
            parser._remove_action(action)
            for group in parser._action_groups:
                if action in group._group_actions:
                    group._group_actions.remove(action)
    return parser


def command_names() -> list[str]:
    return sorted(p.stem for p in (PACKAGE / "management" / "commands").glob("*.py") if p.stem != "__init__")


class CommandHelp(Directive):
    """`{durableruns-command} NAME`: the command's usage and options as its parser prints them (Django's common
    options left out)."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        parser = command_parser(self.arguments[0])
        text = parser.format_help().rstrip()
        return [nodes.literal_block(text, text, language="text")]


# -- completeness -------------------------------------------------------------------------------------------


def _pages() -> str:
    return "\n".join(p.read_text() for p in DOCS.rglob("*.md"))


def _page(relative: str) -> str:
    path = DOCS / relative
    return path.read_text() if path.exists() else ""


def missing_settings(text: str) -> list[str]:
    """Every DURABLERUNS_* name the app reads (a prefix such as DURABLERUNS_HEALTH_ stands for a family)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        names.update(re.findall(r"DURABLERUNS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    return sorted(name for name in names if name not in text)


def missing_options(text: str) -> list[str]:
    gaps = []
    for name in command_names():
        if f"`{name}`" not in text and f"## {name}" not in text:
            gaps.append(name)
        for action in command_parser(name)._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and option not in text:
                    gaps.append(f"{name} {option}")
    return gaps


def missing_signals(text: str) -> list[str]:
    from django.dispatch import Signal

    signals = import_module("durableruns.signals")
    names = [name for name, value in vars(signals).items() if isinstance(value, Signal)]
    return sorted(name for name in names if f"`{name}`" not in text)


def missing_metrics(text: str) -> list[str]:
    source = (PACKAGE / "ops" / "metrics.py").read_text()
    names = set(re.findall(r'"(durableruns_[a-z_]+)"', source))
    return sorted(name for name in names if name not in text)


def api_operations() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in the app's OpenAPI document, as the demo site mounts it (/api/)."""
    from durableruns.api.urls import AppSchemaGenerator

    schema = AppSchemaGenerator().get_schema(request=None, public=True)
    return [(method.upper(), path) for path, operations in schema["paths"].items() for method in operations]


def missing_operations(text: str) -> list[str]:
    gaps = []
    for method, path in api_operations():
        if not re.search(re.escape(f"{method} {path}") + r"(?=[`?\s])", text):
            gaps.append(f"{method} {path}")
    return gaps


def check_pages(app: Sphinx) -> None:
    everything = _pages()
    checks = [
        ("setting", missing_settings(everything), "any page"),
        ("command or option", missing_options(_page("reference/commands.md")), "reference/commands.md"),
        ("signal", missing_signals(_page("reference/signals.md")), "reference/signals.md"),
        ("metric", missing_metrics(_page("reference/metrics.md")), "reference/metrics.md"),
        ("API operation", missing_operations(_page("reference/api.md")), "reference/api.md"),
    ]
    for what, gaps, where in checks:
        for gap in gaps:
            log.warning("undocumented %s: %s is not named in %s", what, gap, where)


def check_python_reference(app: Sphinx, env: Any) -> None:
    """Every name of durableruns.__all__ has its autodoc entry."""
    import durableruns

    documented = set(env.get_domain("py").objects)
    for name in durableruns.__all__:
        if f"durableruns.{name}" not in documented:
            log.warning("undocumented public name: durableruns.%s has no autodoc entry", name)


def write_schema(app: Sphinx, exception: BaseException | None) -> None:
    """Put the API's OpenAPI document beside the pages (openapi.yaml), as the code generates it."""
    if exception is not None or app.builder.format != "html":
        return
    from drf_spectacular.renderers import OpenApiYamlRenderer

    from durableruns.api.urls import AppSchemaGenerator

    schema = AppSchemaGenerator().get_schema(request=None, public=True)
    Path(app.outdir, "openapi.yaml").write_bytes(OpenApiYamlRenderer().render(schema, renderer_context={}))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("durableruns-command", CommandHelp)
    # crontab lines, fenced as ```cron (GitHub highlights them; Pygments has no such lexer): shown as text
    from pygments.lexers.special import TextLexer

    app.add_lexer("cron", TextLexer)
    app.connect("builder-inited", check_pages)
    app.connect("env-check-consistency", check_python_reference)
    app.connect("build-finished", write_schema)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

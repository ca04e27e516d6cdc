"""The house's shape, read from the source with `ast` (nothing imported): the rooms of durableruns/ and the demo
site's project/ import each other in no circle, no module takes a private name from another, and no module of the
app holds more than one concept's worth of lines.

An import is a tie wherever it is written: at the top of a module or inside a function (a lazy import still
needs the other module to run). One under `if TYPE_CHECKING:` is for the type checker alone and is no tie. A
package's __init__ that re-exports its modules' names ties whoever imports the package to each of them, as
Python runs it: `from durableruns import store` is an edge to durableruns.store, and from there to its modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("durableruns", "project")
SKIPPED_DIRS = {"migrations", "__pycache__", "templates", "static"}
MAX_LINES = 600


@dataclass(frozen=True)
class Import:
    """One import statement's tie: the module that writes it, the module of ours it reaches, the names taken."""

    importer: str
    target: str
    names: tuple[str, ...]
    line: int
    typing_only: bool


def our_modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of PACKAGES under `root` (a package by its own name, not __init__)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if SKIPPED_DIRS.intersection(relative.parts[:-1]):
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _under_type_checking(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside an `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) block's body."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                for statement in node.body:
                    hidden.update(id(inner) for inner in ast.walk(statement))
    return hidden


def _owner(dotted: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that `dotted` names, or the nearest enclosing one (a name inside it); None if not ours."""
    while dotted:
        if dotted in modules:
            return dotted
        dotted = dotted.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """Every tie from module `name` (its file `path`) to another module of ours."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    hidden = _under_type_checking(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            reached = [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            reached = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # `from package import module`: a tie to that module
                    reached.append((f"{base}.{alias.name}", ()))
                else:
                    reached.append((base, (alias.name,)))
        else:
            continue
        for dotted, names in reached:
            target = _owner(dotted, modules)
            if target is not None and target != name:
                yield Import(name, target, names, node.lineno, id(node) in hidden)


def import_graph(root: Path, *, with_typing: bool = False) -> tuple[dict[str, set[str]], list[Import]]:
    """module -> the modules of ours it ties itself to; and every import, for the other checks."""
    modules = our_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    every: list[Import] = []
    for name, path in modules.items():
        for found in imports_of(name, path, modules):
            every.append(found)
            if with_typing or not found.typing_only:
                graph[name].add(found.target)
    return graph, every


def circles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Each set of modules that reach each other (strongly connected, more than one): its members, and one
    circle through them, [a, b, ..., a]. Iterative Tarjan, then a walk inside the component for the path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return [(sorted(component), _a_circle_through(component, graph)) for component in components]


def _a_circle_through(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    first = min(component)
    came_from: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), first]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return sorted(component)  # unreachable for a strongly connected component


def private_imports(imports: list[Import]) -> list[str]:
    """`from <another module> import _name`, wherever it is written (under TYPE_CHECKING too: it still reads
    another room's insides)."""
    return sorted({f"{found.importer} imports {name} from {found.target} (line {found.line})"
                   for found in imports for name in found.names
                   if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))})


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """The modules of durableruns/ (migrations aside) longer than `limit` lines."""
    sizes = ((name, len(path.read_text(encoding="utf-8").splitlines()))
             for name, path in our_modules(root).items() if name.split(".")[0] == "durableruns")
    return sorted(f"{name}: {lines} lines" for name, lines in sizes if lines > limit)


def _said(found: list[tuple[list[str], list[str]]]) -> str:
    return "\n".join(f"{' <-> '.join(members)}\n  for one: {' -> '.join(circle)}" for members, circle in found)


def test_the_rooms_import_each_other_in_no_circle():
    graph, _ = import_graph(ROOT)
    found = circles(graph)
    assert not found, f"import circles (a lazy import counts; one under TYPE_CHECKING does not):\n{_said(found)}"


def test_not_even_the_type_checker_sees_a_circle_among_the_app_modules():
    """Counting the imports under TYPE_CHECKING too: a room that names another's types for its hints only still
    must not sit below it. (The demo site is left out: it is the app's user, not one of its rooms.)"""
    graph, _ = import_graph(ROOT, with_typing=True)
    app = {name: {t for t in targets if t.startswith("durableruns")}
           for name, targets in graph.items() if name.startswith("durableruns")}
    found = circles(app)
    assert not found, f"circles counting the type checker's imports:\n{_said(found)}"


def test_no_module_imports_a_private_name_of_another():
    _, imports = import_graph(ROOT)
    found = private_imports(imports)
    assert not found, "private names taken from another module:\n" + "\n".join(found)


def test_no_module_of_the_app_is_over_600_lines():
    found = oversized(ROOT)
    assert not found, f"modules over {MAX_LINES} lines (past that a module holds more than one concept):\n" + "\n".join(
        found)


def test_the_checks_see_what_they_are_meant_to(tmp_path: Path):
    """The walker itself: a lazy import ties, a TYPE_CHECKING one does not, a relative import resolves, a package
    face that re-exports is an edge, a private name is named, and a circle is named with its path."""
    app = tmp_path / "durableruns"
    (app / "sub").mkdir(parents=True)
    (tmp_path / "project").mkdir()
    (app / "__init__.py").write_text("")
    (app / "a.py").write_text("def f():\n    from durableruns import b\n")
    (app / "b.py").write_text("from .sub import c\n")
    (app / "sub" / "__init__.py").write_text("from durableruns.sub.c import thing\n")
    (app / "sub" / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                      "if TYPE_CHECKING:\n    from durableruns import a\n"
                                      "from durableruns.sub.d import _hidden\n")
    (app / "sub" / "d.py").write_text("import durableruns.a\n_hidden = 1\n" + "x = 1\n" * 600)
    graph, imports = import_graph(tmp_path)
    assert graph["durableruns.a"] == {"durableruns.b"}
    assert graph["durableruns.b"] == {"durableruns.sub.c"}
    assert graph["durableruns.sub"] == {"durableruns.sub.c"}
    assert graph["durableruns.sub.c"] == {"durableruns.sub.d"}
    path = ["durableruns.a", "durableruns.b", "durableruns.sub.c", "durableruns.sub.d"]
    assert circles(graph) == [(path, [*path, "durableruns.a"])]
    assert private_imports(imports) == ["durableruns.sub.c imports _hidden from durableruns.sub.d (line 4)"]
    assert oversized(tmp_path) == ["durableruns.sub.d: 602 lines"]

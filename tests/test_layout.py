"""The package's shape: no import cycle, a layered core, a small top level, short modules.

The scan reads the source with :mod:`ast`; nothing is imported. An edge ``a -> b`` is an
import of ``b`` by ``a``, and of the packages that importing ``b`` imports first. Two
graphs are checked for cycles:

- at import time: the statements that run when ``a`` is first imported, at module level
  (inside ``try`` or ``if`` too);
- the layering (``in_functions=True``): every import anywhere in ``a``, inside functions
  and methods too. An import moved into a function to dodge a cycle still ties the two
  modules together, so it counts (STYLE.md, guideline 13).

Neither counts an import under ``if TYPE_CHECKING:``: it never runs, and annotations
may name a type of a layer above (a task's ``build_site`` returns a ``SiteTrainer``).
Relative imports are resolved; ``from pkg import name`` imports the module ``pkg.name``
when there is one.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fedbn_med"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _module_level_imports(node.body)
            found += _module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _module_level_imports(block)
    return found


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Return every import of a module, in functions and classes too, but TYPE_CHECKING's."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo += node.orelse
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        todo += ast.iter_child_nodes(node)
    return sorted(found, key=lambda n: n.lineno)


def _with_parents(name: str, known: dict[str, Path]) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known]


def import_lines(package: Path = PACKAGE, *, in_functions: bool = False
                 ) -> dict[str, dict[str, int]]:
    """Return ``{module: {imported module: line of its first import}}`` within the package."""
    known = modules(package)
    root = package.name
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        found = _all_imports(tree) if in_functions else _module_level_imports(tree.body)
        for node in found:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            ancestors = set(_with_parents(name, known)) - {name}
            for target in targets:
                if target.split(".")[0] != root:
                    continue
                # The importer's own packages are initialised (or being initialised) before
                # it runs: passing through them on the way to a sibling is not a cycle.
                for m in _with_parents(target, known):
                    if m != name and m not in ancestors:
                        graph[name].setdefault(m, node.lineno)
            if isinstance(node, ast.ImportFrom) and base in ancestors:
                # Asking one of its own packages for a name that package defines is.
                if any(f"{base}.{alias.name}" not in known for alias in node.names):
                    graph[name].setdefault(base, node.lineno)
    return graph


def import_graph(package: Path = PACKAGE, *, in_functions: bool = False
                 ) -> dict[str, set[str]]:
    """Return ``{module: modules it imports}`` (see the module's docstring for which count)."""
    return {name: set(targets)
            for name, targets in import_lines(package, in_functions=in_functions).items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """Return one cycle through a strongly connected component: ``[a, b, ..., a]``."""
    start, members = component[0], set(component)
    before: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & members):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(before[path[-1]])
                return [*reversed(path), start]
            if child not in before:
                before[child] = node
                queue.append(child)
    raise ValueError(f"{component} is not a cycle of the graph")


def describe_cycles(lines: dict[str, dict[str, int]]) -> str:
    """Return each cycle of the graph, one edge a line, with where the import is."""
    graph = {name: set(targets) for name, targets in lines.items()}
    out = []
    for component in cycles(graph):
        path = cycle_path(graph, component)
        out.append(f"{len(component)} modules: {', '.join(component)}; for example")
        out += [f"    {a} (line {lines[a][b]}) imports {b}" for a, b in zip(path, path[1:])]
    return "\n".join(out)


def test_the_scan_finds_a_cycle_when_there_is_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_scan_tells_a_package_cycle_from_a_sibling_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub.a import A\n")
    (package / "sub" / "a.py").write_text("from pkg.sub.b import B\nA = B\n")
    (package / "sub" / "b.py").write_text("from .. import core\nB = 1\n")
    (package / "core.py").write_text("import os\n")
    assert cycles(import_graph(package)) == []
    assert import_graph(package)["pkg.sub.b"] == {"pkg.core"}
    # b now asks its own package for a name the package defines: a real cycle.
    (package / "sub" / "b.py").write_text("from pkg.sub import A\nB = 1\n")
    assert cycles(import_graph(package)) == [["pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


def test_the_layering_scan_counts_imports_in_functions(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.high import H\n"
        "def f():\n    from . import high\n    return high\n")
    (package / "high.py").write_text("import pkg.low\nH = 1\n")
    assert cycles(import_graph(package)) == []
    assert cycles(import_graph(package, in_functions=True)) == [["pkg.high", "pkg.low"]]
    text = describe_cycles(import_lines(package, in_functions=True))
    assert "pkg.high (line 1) imports pkg.low" in text
    assert "pkg.low (line 5) imports pkg.high" in text
    # under TYPE_CHECKING only: no edge
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.high import H\nelse:\n    H = None\n")
    assert import_graph(package, in_functions=True)["pkg.low"] == set()
    # a module named by `from package import name` is imported
    (package / "low.py").write_text("class A:\n    def m(self):\n        from pkg import high\n")
    assert import_graph(package, in_functions=True)["pkg.low"] == {"pkg.high"}


def test_the_scan_reads_this_package() -> None:
    graph = import_graph()
    assert "fedbn_med.fl.partition" in graph["fedbn_med.training.trainer"]
    assert "fedbn_med.spec" in graph


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles at import time:\n" + describe_cycles(import_lines())


def test_no_import_cycle_counting_imports_in_functions() -> None:
    lines = import_lines(in_functions=True)
    text = describe_cycles(lines)
    print(text or "no import cycle, counting imports in functions (TYPE_CHECKING's excluded)")
    assert not text, "import cycles, counting imports in functions:\n" + text


def test_the_top_level_holds_at_most_six_modules() -> None:
    # __main__.py is the `python -m fedbn_med` entry point, not a module of the library
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__main__.py")
    assert len(top) <= 6, f"modules at the top of fedbn_med/: {top}"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: module_name(p))
def test_no_module_over_400_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path.relative_to(PACKAGE.parent)} has {lines} lines (at most 400)"


def test_the_core_imports_no_task_engine_or_tracker() -> None:
    graph = import_graph(in_functions=True)
    core = [name for name in graph if name.startswith("fedbn_med.fl")]
    outside = ("fedbn_med.tasks", "fedbn_med.federation", "fedbn_med.tracking",
               "fedbn_med.training", "fedbn_med.cli", "fedbn_med.onboarding")
    reached = {name: sorted(t for t in graph[name] if t.startswith(outside)) for name in core}
    assert not any(reached.values()), reached


#: Commands that turn one task's raw data into its files: they are that task's tools.
DATA_TOOLS = {"fedbn_med.cli.rois": "fedbn_med.tasks.abide.scans",
              "fedbn_med.cli.datalists": "fedbn_med.tasks.imaging.layouts"}


def test_the_comparison_and_the_command_line_import_no_task() -> None:
    # They reach a task through the registry (fedbn_med.tasks: get_task and its hooks,
    # such as Task.cells), never by importing one of its modules.
    graph = import_graph(in_functions=True)
    reached = {}
    for name in sorted(graph):
        if not name.startswith(("fedbn_med.evaluation", "fedbn_med.cli")):
            continue
        tasks = {t for t in graph[name] if t.startswith("fedbn_med.tasks.")}
        allowed = DATA_TOOLS.get(name)
        if allowed is not None:
            tasks = {t for t in tasks if not (allowed + ".").startswith(t + ".")}
        if tasks:
            reached[name] = sorted(tasks)
    assert not reached, f"modules of a task imported by evaluation/ or cli/: {reached}"

"""The shape of the code, read from its sources (issue 29): an import graph without cycles, a library that
starts its deployable units but never imports them, a Lambda that imports only the worker's side, and
each derived value of a run worked out in one place."""

from __future__ import annotations

import ast
from pathlib import Path

from dorylus_py.deploy import ENTRY, import_closure

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("dorylus_py", "graph_servers", "lambda_functions")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(path: Path, top_level_only: bool, typing: bool = True) -> set[str]:
    """The project modules ``path`` imports (``top_level_only``: those its import runs, not the ones
    deferred into functions or kept for type checkers; ``typing=False``: every import that can run, deferred
    ones included, but not those kept for type checkers)."""
    tree, found = ast.parse(path.read_text()), set()
    nodes = _top_level(tree) if top_level_only else ast.walk(tree) if typing else _runtime(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {_resolve(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {_resolve(f"{node.module}.{a.name}") or _resolve(node.module) for a in node.names}
    return found - {None}


def _top_level(tree: ast.Module):
    for node in tree.body:
        if _type_checking(node):
            continue
        yield from ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
            else _class_level(node)


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _runtime(node):
    """Every node under ``node`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not _type_checking(child):
            yield from _runtime(child)


def _class_level(node):
    if isinstance(node, ast.ClassDef):
        for child in node.body:
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from ast.walk(child)


def unit(module: str) -> str:
    """A module's unit: ``dorylus_py.X`` for anything under it, else its top-level package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "dorylus_py" and len(parts) > 1 else parts[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iteratively)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_package_imports_another_that_imports_it_back():
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        for target in imports(path, top_level_only=False):
            if unit(target) != unit(name):
                edges.setdefault(unit(name), set()).add(unit(target))
    assert cycles(edges) == []


def test_no_module_imports_itself_back_when_it_loads():
    edges = {name: imports(path, top_level_only=True) - {name} for name, path in MODULES.items()}
    assert cycles(edges) == []


def test_no_module_imports_itself_back_ever():
    """Not even through an import deferred into a function (inside a folder too, e.g. ``cost/estimate`` and
    ``cost/gpu``): what both sides of such a circle need belongs below them. Imports kept for type
    checkers do not count (they never run)."""
    edges = {name: imports(path, top_level_only=False, typing=False) - {name} for name, path in MODULES.items()}
    assert cycles(edges) == []


def test_the_library_starts_its_deployable_units_but_never_imports_them():
    found = sorted((name, target) for name, path in MODULES.items() if name.startswith("dorylus_py")
                   for target in imports(path, top_level_only=False) if not target.startswith("dorylus_py"))
    assert found == []


def test_the_lambda_imports_only_the_workers_side():
    """The image holds what the handler can import, computed (``deploy.import_closure``): the worker,
    the kernels and models it runs, the wire, the weight blocks; none of the control plane."""
    closure = {p.relative_to(REPO).parts[:2] for p in import_closure(ENTRY)}
    allowed = {("dorylus_py", n) for n in ("__init__.py", "errors.py", "jobkey.py", "kernels", "models", "pipeline", "wire_forms.py",
                                           "protocol", "timescale.py", "weights", "worker")} | {("lambda_functions", n) for n in ("__init__.py", "handler.py")}
    assert closure <= allowed, sorted(closure - allowed)
    assert ("dorylus_py", "worker") in closure and ("dorylus_py", "kernels") in closure


def test_each_derived_value_of_a_run_is_worked_out_in_the_run_plan_only():
    """``--chunks auto`` and each server's Lambda share are resolved by ``plan.py`` alone; everything
    else reads the plan (or the JobSpec that carries it)."""
    calls: dict[str, set[str]] = {"chunks_per_server": set(), "lambda_share": set()}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if called in calls:
                    calls[called].add(name)
    assert calls == {"chunks_per_server": {"dorylus_py.plan"}, "lambda_share": {"dorylus_py.plan"}}


def test_no_source_file_grows_past_450_lines():
    """Files stay under about 400 lines (one concept each); past 450, one has grown two."""
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 450}
    assert long == {}


def starts_python_itself(source: str) -> list[int]:
    """The lines of ``source`` that read ``sys.executable``: a Python started without ``children.py``."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)
            and node.attr == "executable" and isinstance(node.value, ast.Name) and node.value.id == "sys"]


def test_every_python_the_project_starts_goes_through_children():
    """``children.py`` alone names the interpreter (issue 52): every other spawn site gets ``-P`` and
    ``PYTHONSAFEPATH`` from it, so that nothing in the working folder runs in a child."""
    sources = [*MODULES.values(), *(REPO / "benchmarks").glob("*.py")]
    found = {str(p.relative_to(REPO)): lines for p in sources
             if p != REPO / "dorylus_py" / "children.py" and (lines := starts_python_itself(p.read_text()))}
    assert found == {}
    assert starts_python_itself("import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'x'])\n") == [2]

"""The scan behind "no timeout left unscaled": every duration literal a job's processes wait on, and
every duration constant, must go through ``timescale.scaled`` (or ``scaled_ms``). Pure AST, no imports
of the scanned code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What runs in a job's processes (driver, servers, Lambdas, the lab); not the offline tools (data,
# partitioning, cost, the AWS rehearsal, the CLI's other commands).
SCANNED = ["dorylus_py/serving", "dorylus_py/cluster", "dorylus_py/pipeline", "dorylus_py/worker", "dorylus_py/weights",
           "dorylus_py/protocol", "dorylus_py/lab", "dorylus_py/decentral", "dorylus_py/platforms/local.py",
           "dorylus_py/platforms/base.py", "dorylus_py/training", "dorylus_py/cgroups.py", "dorylus_py/scale_model.py",
           "graph_servers"]
SCALERS = {"scaled", "scaled_ms"}
CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*_(S|MS|SECONDS)$")
DURATION_NAME = re.compile(r"(^|_)(timeout|deadline|wait|delay|every|interval|after)(_|$)|_(s|ms)$")
WAITS = {"sleep", "wait", "join", "poll", "result", "recv", "settimeout"}


def _literal(node) -> bool:
    """A number, or arithmetic on numbers only (``2 * 60``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool) and node.value != 0
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    return False


def _name(func) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


class _Scan(ast.NodeVisitor):
    def __init__(self, path: str, constants: set[str]):
        self.path, self.constants, self.found, self.scope, self.inside = path, constants, [], [], 0

    def _add(self, node, what: str) -> None:
        self.found.append((self.path, ".".join(self.scope) or "<module>", what))

    def _def(self, node) -> None:
        self.scope.append(node.name)
        args = node.args
        scaled_here = {n.id if isinstance(n, ast.Name) else n.attr for call in ast.walk(node)
                       if isinstance(call, ast.Call) and _name(call.func) in SCALERS
                       for n in ast.walk(call) if isinstance(n, (ast.Name, ast.Attribute))}  # a default the body scales is scaled
        positional = (args.posonlyargs + args.args)[-len(args.defaults):] if args.defaults else []
        for arg, default in [*zip(positional, args.defaults), *zip(args.kwonlyargs, args.kw_defaults)]:
            if (default is not None and DURATION_NAME.search(arg.arg) and _literal(default)
                    and arg.arg not in scaled_here):
                self._add(node, f"default {arg.arg}={ast.unparse(default)}")
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _def

    def visit_ClassDef(self, node) -> None:
        self.scope.append(node.name)
        for stmt in node.body:  # dataclass fields
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None
                    and DURATION_NAME.search(stmt.target.id) and _literal(stmt.value)):
                self._add(stmt, f"field {stmt.target.id}={ast.unparse(stmt.value)}")
        self.generic_visit(node)
        self.scope.pop()

    def visit_Call(self, node) -> None:
        name = _name(node.func)
        if name in SCALERS:
            self.inside += 1
            self.generic_visit(node)
            self.inside -= 1
            return
        if name in WAITS and node.args and _literal(node.args[0]):
            self._add(node, f"{name}({ast.unparse(node.args[0])})")
        for kw in node.keywords:
            if kw.arg and DURATION_NAME.search(kw.arg) and _literal(kw.value):
                self._add(node, f"{name}({kw.arg}={ast.unparse(kw.value)})")
        self.generic_visit(node)

    def visit_BinOp(self, node) -> None:
        if isinstance(node.op, ast.Add) and isinstance(node.left, ast.Call) and _name(node.left.func) == "monotonic" \
                and _literal(node.right) and not self.inside:
            self._add(node, f"monotonic() + {ast.unparse(node.right)}")
        self.generic_visit(node)

    def visit_Name(self, node) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.constants and not self.inside:
            self._add(node, f"{node.id} unscaled")


def files() -> list[Path]:
    out = []
    for entry in SCANNED:
        p = ROOT / entry
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def unscaled() -> list[tuple[str, str, str]]:
    """(file, function, what) for each duration that does not go through the scale."""
    trees = {str(f.relative_to(ROOT)): ast.parse(f.read_text()) for f in files()}
    constants = {t.id for tree in trees.values() for stmt in tree.body if isinstance(stmt, ast.Assign)
                 for t in stmt.targets if isinstance(t, ast.Name) and CONSTANT.match(t.id) and _literal(stmt.value)}
    found = []
    for path, tree in trees.items():
        scan = _Scan(path, constants)
        scan.visit(tree)
        found += scan.found
    return found

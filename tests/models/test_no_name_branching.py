"""No module outside ``dorylus_py/models/`` compares a model's name: what differs between GCN, GAT and
GraphSAGE is their :class:`~dorylus_py.models.Architecture`'s, so a new model is a new class there, not
a hunt for ``== "gat"`` across the code (issue 29)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dorylus_py.errors import ConfigError
from dorylus_py.models import MODELS, architecture
from dorylus_py.models.spec import model_spec

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dorylus_py", "graph_servers", "lambda_functions")
ALLOWED = REPO / "dorylus_py" / "models"


def _names_a_model(node: ast.AST) -> bool:
    """``node`` is a string literal naming a model, or a tuple, list or set display holding one."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_model(e) for e in node.elts)
    return isinstance(node, ast.Constant) and node.value in MODELS


def name_comparisons(source: str) -> list[str]:
    """The source of every comparison (``==``, ``!=``, ``in``, ``is`` and their negations, either side) of
    a model's name as a string literal, every ``case "gat":`` and every dict display keyed by one."""
    tree, found = ast.parse(source), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(_names_a_model(side) for side in (node.left, *node.comparators)):
                found.append(node)
        elif isinstance(node, ast.MatchValue) and _names_a_model(node.value):
            found.append(node)
        elif isinstance(node, ast.Dict) and any(k is not None and _names_a_model(k) for k in node.keys):
            found.append(node)
    return [ast.get_source_segment(source, n) for n in found]


def test_the_check_finds_each_form_of_branching_on_a_name():
    branching = '''
if cfg.model == "gat": pass
if "sage" != model: pass
x = model in ("gcn", "sage")
y = name not in ['gat']
match spec.name:
    case "gcn": pass
z = {"gcn": 1, "gat": 2}[name]
'''
    assert len(name_comparisons(branching)) == 6
    neutral = 'model = "gcn"\nlabel = f"gat {heads}"\nif spec.aggregation == "mean": pass\nf(model="sage")\n'
    assert name_comparisons(neutral) == []


def test_no_module_outside_models_compares_a_model_name():
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if ALLOWED not in path.parents:
                rel = path.relative_to(REPO).as_posix()
                for segment in name_comparisons(path.read_text()):
                    found[(rel, segment)] = found.get((rel, segment), 0) + 1
    unexpected = sorted(found)
    assert not unexpected, f"branching on a model's name outside dorylus_py/models/ (give Architecture a property): {unexpected}"


def test_an_unknown_model_is_refused_in_one_line():
    for read in (lambda: architecture("gatt"), lambda: model_spec("gatt", [4, 2]), lambda: architecture(["gat"])):
        with pytest.raises(ConfigError, match=r"^unknown model .*; choose one of gcn, gat, sage$"):
            read()

"""The reference graphs shipped with the package (issue 56): reachable by name in every command that takes a
dataset, never in place of a user's own file or folder of that name, and carried by every install."""

from __future__ import annotations

import fnmatch
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dorylus_py import datasets, predict
from dorylus_py.cli import main
from dorylus_py.datasets import FOLDER, NAMES, resolve
from tests.conftest import DATASETS

REPO = Path(__file__).resolve().parents[2]
PLANETOID = {"cora": (2708, 10556, 1433, 7, 140), "citeseer": (3327, 9104, 3703, 6, 120)}


def test_the_package_ships_cora_and_citeseer_with_their_source_and_licence():
    assert set(NAMES) == set(PLANETOID) and DATASETS == FOLDER  # the tests read them from the package
    for name, (nodes, edges, features, classes, train) in PLANETOID.items():
        with np.load(FOLDER / f"{name}.npz", allow_pickle=False) as z:
            assert (len(z["labels"]), len(z["src"]), z["features"].shape[1]) == (nodes, edges, features)
            assert int(z["labels"].max()) + 1 == classes and int(z["train_mask"].sum()) == train
    about = (FOLDER / "README.md").read_text() + (FOLDER / "LICENSE").read_text()
    assert "Planetoid" in about and "MIT" in about and "Copyright (c) 2016 Thomas Kipf" in about


def test_every_install_carries_them():
    """What setuptools puts in a wheel (and an editable install): the package data globs of pyproject.toml
    cover every file of the folder."""
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dorylus_py"]
    shipped = [p.relative_to(FOLDER.parent).as_posix() for p in FOLDER.iterdir() if p.suffix != ".py" and p.is_file()]
    assert sorted(shipped) == ["datasets/LICENSE", "datasets/README.md", "datasets/citeseer.npz", "datasets/cora.npz"]
    assert all(any(fnmatch.fnmatch(f, g) for g in globs) for f in shipped), (shipped, globs)
    assert sum((FOLDER / f"{n}.npz").stat().st_size for n in NAMES) < 600_000  # a small wheel


def test_a_name_reads_the_bundled_graph_only_where_nothing_has_that_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert resolve("cora") == str(FOLDER / "cora.npz") and resolve("cora.npz") == "cora.npz"
    assert resolve("s3://bucket/cora") == "s3://bucket/cora" and resolve(tmp_path) == tmp_path
    assert main(["check", "cora", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == 2708
    (tmp_path / "cora").write_text("0 1\n1 2\n")  # the user's own edge list called cora: it is what is read
    assert resolve("cora") == "cora"
    assert main(["check", "cora"]) == 2
    assert "error: cora: an edge list needs --features" in capsys.readouterr().err
    (tmp_path / "cora").unlink()
    (tmp_path / "cora").mkdir()  # a folder of that name (an empty one) is read too, and refused as what it is
    assert main(["check", "cora"]) == 2 and "cora" in capsys.readouterr().err


def test_train_and_predict_take_the_names(tmp_path, monkeypatch, capsys):
    """(`dorylus prepare cora` is the README tour's first step: tests/test_readme.py.)"""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", "citeseer", "--epochs", "1", "--out", "runs/cs", "--quiet"]) == 0
    line = capsys.readouterr().out
    assert "1 epoch on citeseer (3,327 vertices, 9,104 edges, 6 classes) in " in line  # the closing line names it
    assert json.loads((tmp_path / "runs/cs/config.json").read_text())["data"] == "citeseer"
    assert predict("runs/cs").accuracy("test") == json.loads((tmp_path / "runs/cs/summary.json").read_text())[
        "test_acc_at_best_val"]  # the record's name is read again as the bundled graph


@pytest.mark.parametrize("command", ["check", "prepare", "train"])
def test_help_says_the_rule(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "cora, citeseer the reference graphs shipped with dorylus-py" in text
    assert "only where no file or folder of that name exists is it the bundled graph" in text
    assert all(name in text for name in datasets.NAMES)

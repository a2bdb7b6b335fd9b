"""--overwrite deletes only what dorylus wrote: a run record's files, a prepared store's manifest and what
it lists. A folder holding anything else is refused in one line naming it, with nothing deleted."""

from __future__ import annotations

import os

import pytest

from dorylus_py.atomic import remove_owned
from dorylus_py.errors import ConfigError
from tests.security.cli import dorylus, refused

SMALL = ["--nodes", 300, "--edges", 2000, "--features", 8, "--classes", 3, "--seed", 7]


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "g.npz"
    assert dorylus("synth", "--out", path, *SMALL).returncode == 0
    return path


def thesis_folder(root):
    """The issue's folder: a config.json of the user's, a thesis and a sub-folder."""
    root.mkdir()
    (root / "config.json").write_text('{"mine": true}')
    (root / "thesis.tex").write_text("\\documentclass{book}")
    (root / "sub").mkdir()
    (root / "sub" / "notes.txt").write_text("chapter 3")
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def held(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None for p in root.rglob("*")}


def test_train_overwrite_keeps_a_folder_with_the_users_files(graph, tmp_path):
    before = thesis_folder(tmp_path / "d")
    err = refused(dorylus("train", "--data", graph, "--epochs", 1, "--quiet", "--out", tmp_path / "d", "--overwrite"),
                  "thesis.tex")
    assert held(tmp_path / "d") == before, err


def test_prepare_overwrite_keeps_a_folder_with_the_users_files(graph, tmp_path):
    before = thesis_folder(tmp_path / "d2")
    refused(dorylus("prepare", graph, "-k", 2, "--out", tmp_path / "d2", "--overwrite"), "thesis.tex")
    assert held(tmp_path / "d2") == before


@pytest.mark.long
def test_a_distributed_record_is_replaced_whole_but_a_file_added_to_it_is_kept(graph, tmp_path):
    """A cpu run's record (logs/, checkpoints/, the partitions it made) is ours: replaced. One user file
    anywhere in it (here inside logs/), or an empty folder of theirs, and nothing is deleted."""
    out = tmp_path / "run"
    train = ["train", "--backend", "cpu", "--graph-servers", 1, "--data", graph, "--epochs", 2, "--checkpoint-every", 1,
             "--quiet", "--out", out]
    assert dorylus(*train).returncode == 0
    assert {"logs", "checkpoints", "partitions", "summary.json"} <= {p.name for p in out.iterdir()}
    (out / "logs" / "mine.md").write_text("my notes on this run")
    before = held(out)
    refused(dorylus(*train, "--overwrite"), "logs/mine.md")
    assert held(out) == before
    (out / "logs" / "mine.md").unlink()
    (out / "partitions" / "part-00000" / "extra").mkdir()
    refused(dorylus(*train, "--overwrite"), "partitions/part-00000/extra")
    (out / "partitions" / "part-00000" / "extra").rmdir()
    proc = dorylus(*train, "--epochs", 1, "--overwrite")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_prepared_store_is_replaced_but_not_with_a_file_added(graph, tmp_path):
    prepare = ["prepare", graph, "-k", 2, "--out", tmp_path / "p"]
    assert dorylus(*prepare).returncode == 0
    (tmp_path / "p" / "part-00001" / "README").write_text("mine")
    refused(dorylus(*prepare, "--overwrite"), "part-00001/README")
    assert (tmp_path / "p" / "part-00001" / "README").read_text() == "mine"
    (tmp_path / "p" / "part-00001" / "README").unlink()
    assert dorylus(*prepare, "--overwrite").returncode == 0


def test_a_symlink_in_a_record_is_refused_and_its_target_untouched(graph, tmp_path):
    out = tmp_path / "run"
    assert dorylus("train", "--data", graph, "--epochs", 1, "--quiet", "--out", out).returncode == 0
    target = tmp_path / "precious.npz"
    target.write_bytes(b"keep")
    (out / "weights.npz").unlink()
    os.symlink(target, out / "weights.npz")  # a name the record uses, pointing elsewhere
    refused(dorylus("train", "--data", graph, "--epochs", 1, "--quiet", "--out", out, "--overwrite"), "weights.npz")
    assert target.read_bytes() == b"keep" and (out / "weights.npz").is_symlink()


def test_synth_over_a_folder_is_one_line(tmp_path):
    (tmp_path / "d").mkdir()
    refused(dorylus("synth", "--out", tmp_path / "d", "--overwrite", *SMALL), "is a folder")
    assert list((tmp_path / "d").iterdir()) == []


def test_remove_owned_deletes_nothing_when_anything_is_foreign(tmp_path):
    for name in ("a.json", "b/c.json", "b/theirs.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    with pytest.raises(ConfigError, match="b/theirs.txt"):
        remove_owned(tmp_path, {"a.json", "b/c.json"})
    assert sorted(held(tmp_path)) == ["a.json", "b", "b/c.json", "b/theirs.txt"]
    (tmp_path / "b" / "theirs.txt").unlink()
    remove_owned(tmp_path, {"a.json", "b/c.json"})
    assert list(tmp_path.iterdir()) == []

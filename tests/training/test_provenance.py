"""What a run record notes of its data (training/provenance.py): a file's bytes, a dataset folder's files, a
prepared store's content (the same when the same data is prepared again), and nothing hashed that cannot match."""

from __future__ import annotations

import os

import pytest

from dorylus_py.data import SynthConfig, generate, write_bsnap, write_npz
from dorylus_py.errors import DataError
from dorylus_py.partition import prepare
from dorylus_py.training.provenance import digest


def test_a_file_is_its_bytes_and_is_not_hashed_when_its_size_differs(small_graph, tmp_path):
    write_npz(small_graph, tmp_path / "g.npz")
    noted = digest(str(tmp_path / "g.npz"))
    assert noted["kind"] == "file" and noted["bytes"] == (tmp_path / "g.npz").stat().st_size
    assert digest(str(tmp_path / "g.npz"), noted) == noted
    assert digest(str(tmp_path / "g.npz"), noted | {"bytes": 10})["sha256"] is None  # never read


def test_a_dataset_folder_is_every_file_in_it(small_graph, tmp_path):
    """Dorylus binary files: the folder (also when named by its graph.bsnap); a changed, added or
    renamed file changes it; a FIFO in it is refused, a link loop is walked once."""
    write_bsnap(small_graph, tmp_path / "ds")
    noted = digest(str(tmp_path / "ds"))
    assert noted["kind"] == "folder" and digest(str(tmp_path / "ds" / "graph.bsnap")) == noted
    (tmp_path / "ds" / "sub").mkdir()
    os.symlink(tmp_path / "ds", tmp_path / "ds" / "sub" / "loop")
    assert digest(str(tmp_path / "ds")) == noted  # a folder of no files, and a link to one already walked
    (tmp_path / "ds" / "notes.txt").write_text("x")
    added = digest(str(tmp_path / "ds"))
    assert added["bytes"] == noted["bytes"] + 1 and added["sha256"] != noted["sha256"]
    os.replace(tmp_path / "ds" / "notes.txt", tmp_path / "ds" / "notez.txt")
    renamed = digest(str(tmp_path / "ds"))
    assert renamed["bytes"] == added["bytes"] and renamed["sha256"] != added["sha256"]
    os.mkfifo(tmp_path / "ds" / "pipe")
    with pytest.raises(DataError, match="pipe: not a regular file or a folder"):
        digest(str(tmp_path / "ds"))


def test_a_store_is_its_manifests_content_not_its_timings(small_graph, tmp_path):
    prepare(small_graph, tmp_path / "s", 2)
    noted = digest(str(tmp_path / "s"))
    assert noted["kind"] == "store"
    prepare(small_graph, tmp_path / "s", 2, overwrite=True)  # new timings in the manifest, same data
    assert digest(str(tmp_path / "s")) == noted
    prepare(generate(SynthConfig(nodes=600, edges=6_000, features=16, classes=4, seed=4)), tmp_path / "s", 2,
            overwrite=True)
    assert digest(str(tmp_path / "s"))["sha256"] != noted["sha256"]

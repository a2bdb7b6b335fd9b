"""A run record or a dataset someone shared runs nothing and reads nothing it should not: a ``.pt`` is unpickled
with only PyG's data classes allowed, and `predict` and `--resume` read a record's data only if it holds what
the record noted at training (else one line says to pass --data)."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import threading
import zipfile

import numpy as np
import pytest

from dorylus_py.cli import main
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.training.provenance import note
from tests.security.cli import dorylus, refused

torch = pytest.importorskip("torch")
tg = pytest.importorskip("torch_geometric")


class _Call:
    """Pickles as a call of ``fn(*args)``: what a hostile pickle is."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def writes_marker(marker) -> _Call:
    return _Call(builtins.exec, f"open({str(marker)!r}, 'w').write('ran')")


def direct_pickle(folder, marker):
    """The plain attack: a .pt whose unpickling calls exec."""
    torch.save(writes_marker(marker), folder / "evil.pt")
    return folder / "evil.pt"


def pyg_chain(folder, marker):
    """Through a class torch_geometric registers as safe for every torch.load(weights_only=True) in the
    process: ClusterData's constructor, given a save_dir holding part_2/metis.pt, loads that file through
    PyG's loader, which falls back to unsafe unpickling when the safe one refuses it."""
    from torch_geometric.data import Data
    from torch_geometric.loader import ClusterData

    (folder / "cache" / "part_2").mkdir(parents=True)
    torch.save(writes_marker(marker), folder / "cache" / "part_2" / "metis.pt")
    graph = _Call(Data, None, torch.zeros(2, 1, dtype=torch.long))
    torch.save(_Call(ClusterData, graph, 2, False, str(folder / "cache")), folder / "evil.pt")
    return folder / "evil.pt"


@pytest.mark.parametrize("attack", [direct_pickle, pyg_chain])
def test_a_pt_dataset_that_would_run_code_is_refused_and_runs_nothing(tmp_path, attack):
    from dorylus_py.data import load_graph

    marker = tmp_path / "ran"
    evil = attack(tmp_path, marker)
    with pytest.raises(DataError, match="evil.pt: not a saved PyG Data this package reads without running code"):
        load_graph(evil)
    assert not marker.exists()


def test_the_pyg_chain_does_run_code_through_a_plain_weights_only_load(tmp_path):
    """Why the allowlist is swapped for each load rather than trusted: the same file, through torch's own
    safe loading once torch_geometric is imported, runs the code (this test shows the hole, not ours)."""
    marker = tmp_path / "ran"
    evil = pyg_chain(tmp_path, marker)
    with pytest.warns(UserWarning, match="Weights only load failed"):
        torch.load(evil, weights_only=True)
    assert marker.read_text() == "ran"


def test_check_refuses_a_pickle_in_one_line(tmp_path, capsys):
    """`dorylus check evil.pt`: exit 2, one line, nothing run."""
    marker = tmp_path / "ran"
    assert main(["check", str(direct_pickle(tmp_path, marker))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "it calls or builds exec, which is not allowed" in err, err
    assert not marker.exists()


def within(seconds: float, fn, *args):
    """``fn(*args)``, failing the test if it has not returned after ``seconds`` (its thread is left behind)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, f"still running after {seconds} s"
    return result[0]


def test_a_real_pyg_data_still_loads_and_the_process_allowlist_is_put_back(tmp_path):
    """A Data saved by torch_geometric loads through the narrowed allowlist; other PyG classes do not
    (HeteroData is on PyG's list); torch's process-wide list is what it was before."""
    from torch_geometric.data import Data, HeteroData

    from dorylus_py.data import load_graph

    before = torch.serialization.get_safe_globals()
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    torch.save(Data(x=torch.rand(4, 3), y=torch.tensor([0, 1, 0, 1]), edge_index=ei), tmp_path / "g.pt")
    graph = load_graph(tmp_path / "g.pt")
    assert graph.num_nodes == 4 and graph.num_edges == 4 and graph.num_features == 3
    torch.save(HeteroData(), tmp_path / "h.pt")
    with pytest.raises(DataError, match="h.pt: .*it calls or builds torch_geometric.data.hetero_data.HeteroData, which"):
        load_graph(tmp_path / "h.pt")
    torch.save({"x": torch.rand(2)}, tmp_path / "d.pt")
    with pytest.raises(DataError, match="d.pt: holds a dict, not a PyG Data object"):
        load_graph(tmp_path / "d.pt")
    assert set(torch.serialization.get_safe_globals()) == set(before)


def test_a_pt_zip_bomb_a_fifo_and_a_legacy_file_are_refused_unread(tmp_path):
    from dorylus_py.data import load_graph

    with zipfile.ZipFile(tmp_path / "bomb.pt", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb/data.pkl", bytes(64 << 20))
    with pytest.raises(DataError, match="bomb.pt: its members claim 67,108,864 bytes, more than the file's"):
        load_graph(tmp_path / "bomb.pt")
    os.mkfifo(tmp_path / "fifo.pt")
    with pytest.raises(DataError, match="fifo.pt: not a regular file"):
        load_graph(tmp_path / "fifo.pt")
    torch.save({"x": 1}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(DataError, match="old.pt: not a saved PyG Data in torch's zip format"):
        load_graph(tmp_path / "old.pt")


# --- run records that name their data ---------------------------------------------------------------


@pytest.fixture()
def trained(small_run):
    """A small reference run on g.npz (its record), and that file."""
    return small_run


def shared(trained, tmp_path, **config) -> tuple:
    """A copy of the run record in tmp_path/shared, its config.json changed by ``config``."""
    record = shutil.copytree(trained[0], tmp_path / "shared")
    old = json.loads((record / "config.json").read_text())
    (record / "config.json").write_text(json.dumps(old | config))
    return record, old


def test_the_run_notes_its_data_and_predict_follows_it(trained):
    from dorylus_py.api import predict

    run, data = trained
    config = json.loads((run / "config.json").read_text())
    assert config["checksums"] == {"data": note({"data": str(data)})["data"]}
    assert config["checksums"]["data"]["kind"] == "file" and config["checksums"]["data"]["bytes"] == data.stat().st_size
    assert predict(run).graph.num_nodes == 300


def test_a_shared_record_that_ships_a_pickle_as_its_data_runs_nothing(trained, tmp_path):
    """The issue's attack: a record whose config.json names a .pt it ships, checksum and all. The record
    can make its own data pass the checksum; what it cannot do is make the .pt run."""
    record, _ = shared(trained, tmp_path)
    marker = tmp_path / "ran"
    direct_pickle(record, marker)
    config = json.loads((record / "config.json").read_text())
    config |= {"data": "evil.pt", "checksums": note({"data": str(record / "evil.pt")})}
    (record / "config.json").write_text(json.dumps(config))
    refused(dorylus("predict", record, "--out", tmp_path / "p.npy", cwd=tmp_path), "evil.pt: not a saved PyG Data")
    assert not marker.exists() and not (tmp_path / "p.npy").exists()


def test_a_record_with_its_data_inside_predicts_wherever_it_is(trained, tmp_path, monkeypatch):
    """Shared with its data: config.json names g.npz where it was trained; the copy in the record, which
    holds what the checksum says, is read."""
    from dorylus_py.api import predict

    record, old = shared(trained, tmp_path)
    shutil.copy(trained[1], record / "g.npz")
    monkeypatch.chdir(tmp_path)  # no g.npz here
    (record / "config.json").write_text(json.dumps(old | {"data": "g.npz"}))  # as if trained in another folder
    np.testing.assert_array_equal(predict(record).logits, predict(trained[0]).logits)
    (record / "g.npz").write_bytes((record / "g.npz").read_bytes()[:-1])
    with pytest.raises(ConfigError, match="g.npz: not the dataset the run in .* trained on .*; pass data=PATH"):
        predict(record)


@pytest.mark.parametrize("forgery,message", [  # through the Python API: its words (data=PATH), not the flags
    ({"checksums": None}, "notes no checksum of the data the run trained on .*; pass data=PATH"),
    ({"checksums": {"data": {"kind": "file", "bytes": 1, "sha256": "no"}}}, "no checksum of its dataset"),
    ({"data": "/proc/self/status"}, "/proc/self/status: lies in /proc or /sys: not a dataset; pass data=PATH"),
    ({"data": "/dev/zero"}, "/dev/zero: not a regular file \\(a character device\\); pass data=PATH"),
    ({"data": "elsewhere.npz"}, "elsewhere.npz: the dataset .* names is not there"),
    ({"sources": {"features": 3}}, "its Sources\\(features=...\\) file is '3', not a path; pass data=PATH with its "
                                   "Sources\\(features=...\\)"),
])
def test_a_record_whose_data_cannot_be_checked_is_refused_in_one_line(trained, tmp_path, forgery, message):
    """Refused before anything is read, each with the way out (--data), which then works."""
    from dorylus_py.api import predict

    record, _ = shared(trained, tmp_path, **forgery)
    with pytest.raises((ConfigError, DataError), match=message):
        predict(record)
    assert predict(record, trained[1]).graph.num_nodes == 300


def test_a_fifo_or_a_device_in_place_of_the_data_is_refused_without_waiting(trained, tmp_path, capsys):
    """A record whose data is now a FIFO (a plain open would wait for a writer forever), then a link to
    /dev/zero (which never ends): one line each, at once."""
    record, _ = shared(trained, tmp_path)
    data = tmp_path / "g.npz"
    config = json.loads((record / "config.json").read_text())
    (record / "config.json").write_text(json.dumps(config | {"data": str(data)}))
    predict = ["predict", str(record), "--out", str(tmp_path / "p.npy")]
    os.mkfifo(data)
    assert within(60, main, predict) == 2
    assert "g.npz: not a regular file (a FIFO); pass --data PATH\n" in capsys.readouterr().err
    data.unlink()
    os.symlink("/dev/zero", data)
    assert within(60, main, predict) == 2
    assert "g.npz: not a regular file (a character device); pass --data PATH\n" in capsys.readouterr().err


def test_resume_reads_the_records_data_only_as_noted(trained, tmp_path, capsys):
    """--resume of a distributed run that kept no copy of its data (config.json as such a run writes it):
    data that changed, a FIFO, or a record with no checksum are refused in one line before anything is
    written; --data given with --resume is the user's choice, and is read (here the run then stops at its
    missing checkpoints, the next step)."""
    data = tmp_path / "g.npz"
    shutil.copy(trained[1], data)
    record, _ = shared(trained, tmp_path, backend="cpu", graph_servers=1, data=str(data))
    resume = ["train", "--resume", str(record), "--epochs", "3", "--quiet"]
    metrics = (record / "metrics.jsonl").read_text()
    data.write_bytes(data.read_bytes()[:-1])
    assert main(resume) == 2
    assert "g.npz: not the dataset the run in" in capsys.readouterr().err
    data.unlink()
    os.mkfifo(data)
    assert within(60, main, resume) == 2
    assert "g.npz: not a regular file (a FIFO); pass --data PATH\n" in capsys.readouterr().err
    config = json.loads((record / "config.json").read_text())
    (record / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "checksums"}))
    assert main(resume) == 2
    assert "notes no checksum of the data the run trained on" in capsys.readouterr().err
    assert main([*resume, "--features", str(data)]) == 2  # a side file alone is not --data
    assert capsys.readouterr().err.startswith("error: --features: --resume")
    assert main([*resume, "--data", str(trained[1])]) == 2
    assert "checkpoints/latest.json: missing: no checkpoint written yet" in capsys.readouterr().err
    assert (record / "metrics.jsonl").read_text() == metrics

"""`dorylus report RUN_DIR --servers`: what each server did, from the start and end lines of its log."""

from dorylus_py.cli import main
from dorylus_py.cost.server_logs import server_rows
from dorylus_py.data import write_npz


def test_every_server_says_what_it_did(small_graph, tmp_path, capsys):
    write_npz(small_graph, tmp_path / "g.npz")
    out = tmp_path / "run"
    assert main(["train", "--data", str(tmp_path / "g.npz"), "--backend", "local", "-k", "2", "--lambdas", "2",
                 "--chunks", "3", "--epochs", "2", "--out", str(out), "--quiet"]) == 0
    rows = {r["server"]: r for r in server_rows(out)}
    assert set(rows) == {"graph-server-0", "graph-server-1", "weight-server-0"}
    gs = [rows["graph-server-0"], rows["graph-server-1"]]
    assert sum(r["vertices"] for r in gs) == small_graph.num_nodes
    assert all(r["peers"] == 1 and r["ghosts"] > 0 and r["tensor work"] == "local-lambda" for r in gs)
    assert all(r["epochs"] == 2 and r["tasks"] >= 2 * 3 * 8 and r["sent MB"] > 0 and r["peak MiB"] > 10 for r in gs)
    assert rows["weight-server-0"]["updates"] == 2 * 2  # two layers, one update each per epoch
    capsys.readouterr()
    assert main(["report", str(out), "--servers"]) == 0
    printed = capsys.readouterr().out
    assert "servers of" in printed and "graph-server-1" in printed and "weight-server-0" in printed


def test_a_reference_run_has_no_servers(small_graph, tmp_path, capsys):
    write_npz(small_graph, tmp_path / "g.npz")
    assert main(["train", "--data", str(tmp_path / "g.npz"), "--epochs", "1", "--out", str(tmp_path / "r"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r"), "--servers"]) == 2
    assert "no server logs" in capsys.readouterr().err

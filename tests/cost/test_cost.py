import json

import pytest

from dorylus_py.cli import main
from dorylus_py.cost import Prices, read_record, run_cost
from dorylus_py.errors import ConfigError, DataError


def make_record(d, backend="local", tasks=True):
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"backend": backend, "mode": "sync", "graph_servers": 2, "weight_servers": 1}))
    rows = [{"epoch": e, "loss": 1.0 / e, "train_acc": 0.5, "val_acc": 0.2 * e, "test_acc": 0.1 * e, "epoch_s": 1.0,
             "wall_s": 1800.0 * e} for e in (1, 2)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"best_val_acc": 0.4, "test_acc_at_best_val": 0.2, "relaunches": 1}))
    if tasks:
        t = [{"kind": "fwd", "train": True, "where": "local-lambda", "billed_ms": 2000, "memory_mb": 2048, "start": 0.0, "end": 2.0},
             {"kind": "bwd", "train": True, "where": "local-lambda", "billed_ms": 1000, "memory_mb": 1024, "start": 2.0, "end": 3.0},
             {"kind": "gather", "train": True, "where": "graph-server", "billed_ms": 0, "memory_mb": 0, "start": 3.0, "end": 3.5}]
        (d / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in t))
    return d


def test_hand_computed_cost(tmp_path):
    prices = Prices.load(region="us-east-1")
    config, metrics, tasks, _ = read_record(make_record(tmp_path / "r"))
    c = run_cost(config, metrics[-1]["wall_s"], tasks, prices, "c5.2xlarge")
    # 3 servers x 1 hour x $0.34; Lambdas: 2 s x 2 GB + 1 s x 1 GB = 5 GB-s, 2 requests
    assert c.servers == 3 and c.server_hours == pytest.approx(3.0)
    assert c.server_usd == pytest.approx(1.02)
    assert c.lambda_gb_seconds == pytest.approx(5.0)
    assert c.lambda_usd == pytest.approx(5 * 0.0000166667 + 2 * 0.0000002)
    assert c.value == pytest.approx(1 / (1.0 * (1.02 + 5 * 0.0000166667 + 4e-7)))
    ref_config = {"backend": "reference"}
    assert run_cost(ref_config, 3600.0, [], prices, "m5.xlarge").total_usd == pytest.approx(0.192)


def test_weight_servers_beside_gpus_are_priced_as_a_cpu_type(tmp_path, capsys):
    prices = Prices.load(region="us-east-1")
    config, metrics, tasks, _ = read_record(make_record(tmp_path / "g", backend="gpu"))
    # 2 graph servers on g5.xlarge ($1.006/h) and the weight server on c5.xlarge ($0.17/h), for one hour
    assert run_cost(config, 3600.0, [], prices, "g5.xlarge").server_usd == pytest.approx(2 * 1.006 + 0.17)
    assert run_cost(config, 3600.0, [], prices, "g5.xlarge", "m5.xlarge").server_usd == pytest.approx(2 * 1.006 + 0.192)
    assert run_cost(config, 3600.0, [], prices, "c5.2xlarge").server_usd == pytest.approx(3 * 0.34)  # CPU: one type
    decentral = {"backend": "local", "mode": "gossip", "workers": 2, "weight_servers": 1}  # no weight servers
    assert run_cost(decentral, 3600.0, [], prices, "g5.xlarge").server_usd == pytest.approx(2 * 1.006)
    md = tmp_path / "r.md"
    assert main(["report", str(tmp_path / "g"), "--as-instance", "g5.xlarge", "--markdown", str(md)]) == 0
    assert "graph servers as g5.xlarge at $1.006/h, weight servers as c5.xlarge at $0.17/h" in md.read_text()
    assert main(["report", str(tmp_path / "g"), "--weight-instance", "z9.huge"]) == 2
    assert "no price for instance type 'z9.huge'" in capsys.readouterr().err


def test_report_cli_table_and_markdown(tmp_path, capsys):
    a, b = make_record(tmp_path / "a"), make_record(tmp_path / "b", backend="reference", tasks=False)
    assert main(["report", str(a), str(b), "--target-acc", "0.3", "--markdown", str(tmp_path / "r.md")]) == 0
    out = capsys.readouterr().out
    assert "local sync" in out and "reference" in out and "1.020" in out
    md = (tmp_path / "r.md").read_text()
    assert md.count("\n| ") >= 4 and "Task time by kind" in md
    assert "| run | ApplyVertex | ApplyVertex backward | Gather |\n| --- | --- | --- | --- |\n| a | 2.00 | 1.00 | 0.50 |" in md
    assert "| 3,600.0 |" in md  # time to val 0.3: the second epoch's wall time


def test_bad_records_and_prices(tmp_path, capsys):
    d = make_record(tmp_path / "r")
    (d / "metrics.jsonl").write_text('{"epoch": 1, "loss"')
    with pytest.raises(DataError, match=r"metrics.jsonl:1: not valid JSON"):
        read_record(d)
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "config.json: missing" in capsys.readouterr().err
    assert main(["report", str(d), "--as-instance", "z9.huge"]) == 2
    assert "no price for instance type 'z9.huge'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no 'mars-1'"):
        Prices.load(region="mars-1")


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_plots_are_real_pngs(tmp_path, capsys):
    a = make_record(tmp_path / "a")
    rows = [json.loads(line) for line in (a / "tasks.jsonl").read_text().splitlines()]
    for r, (server, chunk, epoch, layer) in zip(rows, [(0, 0, 1, 0), (0, 1, 1, 0), (0, None, 1, 0)]):
        r.update(server=server, chunk=chunk, epoch=epoch, layer=layer)
    (a / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(a), "--plots", str(tmp_path / "plots")]) == 0
    for name, size in (("accuracy_vs_time.png", (800, 450)), ("accuracy_vs_cost.png", (800, 450)),
                       ("timeline_a.png", (800, 600))):
        path = tmp_path / "plots" / name
        assert path.stat().st_size > 5000 and png_size(path) == size


def test_timeline_legends_cover_no_bars():
    """The legends (the work above, its terms below) sit outside the axes, whatever the number of lanes and kinds."""
    from dorylus_py.cost.plots import COLOURS, timeline_figure
    from dorylus_py.cost.task_names import NAMES

    tasks = [{"kind": kind, "train": train, "server": s, "chunk": c, "start": 0.1 * i, "end": 0.1 * i + 0.3}
             for i, (kind, train) in enumerate(NAMES) for s in (0, 1) for c in (None, 0, 1, 2, 3)]
    fig = timeline_figure("t", tasks)
    fig.canvas.draw()
    axes = fig.axes[0].get_window_extent()
    work, terms = fig.legends
    assert [t.get_text() for t in work.get_texts()] == list(COLOURS)  # every name, each once (evaluation: one)
    assert [t.get_text().split(":")[0] for t in terms.get_texts()] == [
        "Gather", "ApplyVertex", "Scatter", "ApplyEdge", "backward", "last layer, fused"]
    for legend in (work, terms):
        assert not legend.get_window_extent().overlaps(axes), (legend.get_window_extent(), axes)


def test_report_reads_records_that_did_not_complete(tmp_path, capsys):
    """Interrupted, failed, killed (no summary.json) and zero-epoch records are reported with their status."""
    done = make_record(tmp_path / "done")
    stopped = make_record(tmp_path / "stopped")
    (stopped / "summary.json").write_text(json.dumps({"status": "interrupted", "best_val_acc": 0.4,
                                                      "test_acc_at_best_val": 0.2, "wall_s": 3600.0}))
    killed = make_record(tmp_path / "killed")
    (killed / "summary.json").unlink()
    failed = make_record(tmp_path / "failed")
    (failed / "metrics.jsonl").write_text("")
    (failed / "summary.json").write_text(json.dumps({"status": "failed: graph-server-1 exited with code -9",
                                                     "epochs": 0}))
    assert main(["report", *(str(d) for d in (done, stopped, killed, failed)), "--markdown", str(tmp_path / "r.md")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:5]}
    assert rows["done"][3] == "completed" and rows["stopped"][3] == "interrupted" and rows["failed"][3] == "failed"
    assert rows["killed"][3] == "unknown" and rows["killed"][5] == "0.4000"  # from its metrics: epoch 2's val
    assert rows["failed"][4] == "0" and rows["failed"][5] == "-"  # no epochs: no accuracy to show
    assert "failed: failed: graph-server-1 exited with code -9" in out  # the reason, under the table
    assert "| failed | failed: graph-server-1 exited with code -9 |" in (tmp_path / "r.md").read_text()

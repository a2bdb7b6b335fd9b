"""Reports and estimates on real runs: numbers recomputed from tasks.jsonl, a run reproduced from its
own calibration, hand-computed estimates, --search, bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from dorylus_py.cli import main
from dorylus_py.cost.estimate import Calibration, Setup, Workload, setup_of, vcpus
from dorylus_py.cost.model import Prices, read_record
from dorylus_py.cost.report import report_rows
from dorylus_py.data import write_npz


@pytest.fixture(scope="module")
def runs(tmp_path_factory, small_graph):
    """One real `local` and one real `cpu` run (2 graph servers, 4 epochs)."""
    root = tmp_path_factory.mktemp("runs")
    data = root / "g.npz"
    write_npz(small_graph, data)
    for backend in ("local", "cpu"):
        assert main(["train", "--backend", backend, "--data", str(data), "--graph-servers", "2", "--chunks", "2",
                     "--lambdas", "2", "--epochs", "4", "--quiet", "--out", str(root / backend)]) == 0
    return root


def test_report_numbers_agree_with_tasks_jsonl(runs, tmp_path, capsys):
    prices = Prices.load()
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    assert main(["report", str(runs / "local"), str(runs / "cpu"), "--markdown", str(md), "--html", str(page)]) == 0
    rows = {r["run"]: r for r in report_rows([str(runs / "local"), str(runs / "cpu")], prices, "c5.2xlarge", None)}
    for name in ("local", "cpu"):
        config, metrics, tasks, summary = read_record(runs / name)
        lam = [t for t in tasks if t["where"] == "local-lambda"]
        gb_s = sum(t["billed_ms"] * t["memory_mb"] for t in lam) / 1000 / 1024
        servers = config["graph_servers"] + config["weight_servers"]
        server_usd = servers * metrics[-1]["wall_s"] / 3600 * prices.hourly("c5.2xlarge")
        lambda_usd = gb_s * prices.lambda_gb_second + len(lam) * prices.lambda_per_request
        r = rows[name]
        assert r["lambda calls"] == len(lam) and r["GB-s"] == pytest.approx(gb_s)
        assert r["servers $"] == pytest.approx(server_usd) and r["lambda $"] == pytest.approx(lambda_usd)
        assert r["total $"] == pytest.approx(server_usd + lambda_usd)
        gather = sum(t["end"] - t["start"] for t in tasks if t["kind"] == "gather")
        assert r["_kinds"]["gather"] == pytest.approx(gather)
        assert f"| {name} |" in md.read_text() and f"<td>{name}</td>" in page.read_text()
    assert rows["cpu"]["lambda calls"] == 0 and rows["local"]["lambda calls"] > 0
    text = page.read_text()
    assert text.count('src="data:image/png;base64,') == 4  # two accuracy plots, two timelines
    assert "<table>" in text and "Task time by kind" in text


@pytest.mark.parametrize("name", ["local", "cpu"])
def test_estimate_reproduces_a_run_from_its_own_calibration(runs, name, capsys):
    prices = Prices.load()
    row = report_rows([str(runs / name)], prices, "c5.2xlarge", None)[0]
    config, *_ = read_record(runs / name)
    cal = Calibration.from_record(str(runs / name), "c5.2xlarge")
    from dorylus_py.cost.estimate import workload_of

    est = cal.estimate(workload_of(config), setup_of(config, "c5.2xlarge"), prices)
    assert est["total $"] == pytest.approx(row["total $"], rel=0.10)
    assert est["wall s"] == pytest.approx(row["wall s"], rel=0.10)
    # and through the CLI, from the graph's counts
    g = config["graph"]
    capsys.readouterr()
    assert main(["cost", "estimate", "--calibration", str(runs / name), "--backend", name, "--nodes", str(g["nodes"]),
                 "--edges", str(g["edges"]), "--features", str(g["features"]), "--classes", str(g["classes"]),
                 "--graph-servers", "2", "--chunks", "2", "--lambdas", "2", "--epochs", "4"]) == 0
    total = float(re.findall(r"\d+\.\d{5}", capsys.readouterr().out.splitlines()[-1])[-1])
    assert total == pytest.approx(row["total $"], rel=0.10)


def test_hand_computed_estimate():
    cal = Calibration(graph_s_per_unit=1e-6, tensor_s_per_unit=1e-8, billed_per_measured=1.0, tasks_per_server_chunk=8,
                      startup_s=10.0, overlap=1.0, instance="c5.2xlarge", memory_mb=3008, source="hand")
    prices = Prices("us-east-1", {"c5.2xlarge": 0.36, "c5.4xlarge": 0.72}, 1e-5, 2e-7, "t", "t")
    work = Workload(nodes=1000, edges=100_000, dims=[100, 10, 5])  # tensor units 1000 x (1000 + 50)
    setup = Setup("lambda", 2, 1, "c5.2xlarge", lambdas=4, memory_mb=2048, chunks=2, epochs=100)
    e = cal.estimate(work, setup, prices)
    graph = 1e-6 * (100_000 / 2) * 2 * 15  # 1.5 s per epoch
    tensor_total = 1e-8 * 1000 * 1050  # 0.0105 s per epoch, over min(4 Lambdas, 8 x 2 x 2 tasks)
    assert e["epoch s"] == pytest.approx(graph + tensor_total / 4)
    wall = 10 + 100 * e["epoch s"]
    assert e["wall s"] == pytest.approx(wall)
    assert e["servers $"] == pytest.approx(3 * wall / 3600 * 0.36)
    gb_s = tensor_total * 100 * 2048 / 1024
    assert e["GB-s"] == pytest.approx(gb_s) and e["requests"] == 8 * 2 * 2 * 100
    assert e["lambda $"] == pytest.approx(gb_s * 1e-5 + 3200 * 2e-7)
    faster = cal.estimate(work, replace(setup, instance="c5.4xlarge"), prices)  # twice the vCPUs
    assert faster["epoch s"] == pytest.approx(graph / 2 + tensor_total / 4)
    small = cal.estimate(work, replace(setup, memory_mb=512), prices)  # a fraction of a vCPU: slower
    assert small["epoch s"] > e["epoch s"]
    assert vcpus("c5.xlarge") == 4 and vcpus("c5n.4xlarge") == 16 and vcpus("m5.large") == 2


def test_search_lists_cheapest_fastest_and_best_value(capsys):
    assert main(["cost", "estimate", "--nodes", "1000000", "--edges", "20000000", "--features", "128", "--classes", "10",
                 "--search", "--top", "3", "--epochs", "50"]) == 0
    out = capsys.readouterr().out
    for title in ("cheapest of", "fastest of", "best value of"):
        assert title in out
    blocks = out.split("\n\n")
    fastest = [line.split() for line in blocks[2].splitlines()[2:]]
    walls = [float(r[5]) for r in fastest]
    assert walls == sorted(walls)


@pytest.mark.parametrize("argv, message", [
    (["cost", "estimate", "--nodes", "10"], "--edges"),
    (["cost", "estimate", "--nodes", "0", "--edges", "1", "--features", "1", "--classes", "2"], ">= 1"),
    (["cost", "estimate", "--nodes", "9", "--edges", "9", "--features", "9", "--classes", "2", "--as-instance", "x9.big"],
     "no price"),
    (["cost", "estimate", "--calibration", "/nonexistent", "--nodes", "9", "--edges", "9", "--features", "9",
      "--classes", "2"], "missing"),
])
def test_bad_estimate_input_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_reference_run_is_no_calibration(tmp_path, small_graph, capsys):
    data = tmp_path / "g.npz"
    write_npz(small_graph, data)
    assert main(["train", "--data", str(data), "--epochs", "2", "--quiet", "--out", str(tmp_path / "ref")]) == 0
    capsys.readouterr()
    assert main(["cost", "estimate", "--calibration", str(tmp_path / "ref"), "--data", str(data)]) == 2
    assert "distributed backend" in capsys.readouterr().err
    assert json.loads((tmp_path / "ref" / "summary.json").read_text())["status"] == "completed"

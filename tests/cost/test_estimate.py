"""Reports and estimates on real runs: report numbers recomputed from tasks.jsonl; the estimator,
calibrated on one run, predicting two other configurations measured here; --search; bad input."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pytest

from dorylus_py.cli import main
from dorylus_py.cost.estimate import Calibration, Setup, Workload, setup_of, vcpus, workload_of
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


def test_the_bytes_a_graph_server_moves_are_counted_from_the_model(runs):
    """The estimator's bytes per server and epoch (every task's rows, the ghost rows) against what the
    graph servers counted; and the loop's seconds per byte are calibrated from the same counts."""
    for name in ("local", "cpu"):
        config, metrics, *_ = read_record(runs / name)
        measured = statistics.median(statistics.mean(s["bytes"] for s in m["servers"]) for m in metrics[1:])
        parts = json.loads((runs / name / "partitions" / "manifest.json").read_text())["parts"]
        ghosts = statistics.mean(p["ghosts"] for p in parts)  # the store's own count, not the estimate
        work = replace(workload_of(config), known_ghosts=(config["graph_servers"], ghosts))
        counted = setup_of(config, "c5.xlarge").bytes_per_server(work)
        assert work.ghosts(4) != ghosts  # another server count: estimated, not the store's count
        assert counted == pytest.approx(measured, rel=0.1), name
        assert Calibration.from_record(str(runs / name), "c5.xlarge").io_s_per_byte > 0


# The estimator is calibrated on one configuration and predicts two others: a graph four times larger,
# and another number of graph servers. On this one 2-core machine, K servers share its cores, so each
# configuration's servers are described as instances with 2/K of its vCPUs (the estimator only uses the
# ratio of vCPUs); servers and tensor work run one thread each (OMP_NUM_THREADS=1, --tensor-threads 1).
# The machine is shared with other work, which can slow a whole run 2x: each configuration runs twice,
# interleaved, and the less disturbed run (the smaller median epoch) counts, the calibration's too; when
# the two runs of a configuration differ by more than DISAGREE (load came and went), a third round runs
# (a loaded suite once had both calibration runs slowed ~2x while one larger-graph run was not).
# Measured errors (README, load averages 3 to 11): -6 to +92 % for the larger graph; -5 to +175 % for one
# server instead of two. One machine is the wrong place to scale servers: two servers pay for their
# exchange of ghost rows with every stage, more so when other work takes the cores, and the model (made
# for one instance per server) counts no such cost, so it predicts one server no faster than two while
# one server is 1-2.8x faster here. Allowed: within a factor of ALLOWED_FACTOR either way; and for the
# larger graph, closer than the naive guess "as long as the calibration run", which a model blind to
# the graph's size would make.
ALLOWED_FACTOR = 4.0
SHARE_OF_THIS_MACHINE = {2: "c5.xlarge", 1: "c5.2xlarge"}  # graph servers -> an instance with 2/K of its vCPUs
CONFIGURATIONS = (("calibration", 20_000, 2), ("4x graph", 80_000, 2), ("1 server", 20_000, 1))
DISAGREE = 1.25  # slowest / fastest run of a configuration beyond which the machine was too busy to trust either


def steady_epoch_s(run_dir) -> float:
    _, metrics, *_ = read_record(run_dir)
    return statistics.median(m["epoch_s"] for m in metrics[1:])  # the steady epochs, as calibrated


def agree(run_dirs) -> bool:
    epochs = [steady_epoch_s(d) for d in run_dirs]
    return max(epochs) <= DISAGREE * min(epochs)


@pytest.fixture(scope="module")
def configurations(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate")
    runs: dict[str, list] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # the graph-server processes inherit it
        for rep in (1, 2, 3):
            if rep == 3 and all(agree(dirs) for dirs in runs.values()):
                break
            for name, nodes, k in CONFIGURATIONS:
                data = root / f"g{nodes}.npz"
                if not data.exists():
                    assert main(["synth", "--out", str(data), "--nodes", str(nodes), "--edges", str(20 * nodes),
                                 "--features", "64", "--classes", "8"]) == 0
                out = root / f"{name.replace(' ', '-')}-{rep}"
                assert main(["train", "--backend", "cpu", "--data", str(data), "--graph-servers", str(k),
                             "--partitioner", "hash", "--chunks", "2", "--tensor-threads", "1", "--epochs", "6",
                             "--dropout", "0", "--quiet", "--out", str(out)]) == 0
                runs.setdefault(name, []).append(out)
    return {name: min(dirs, key=steady_epoch_s) for name, dirs in runs.items()}


def estimated_epoch_s(cal: Calibration, run_dir) -> float:
    config, *_ = read_record(run_dir)
    setup = setup_of(config, SHARE_OF_THIS_MACHINE[config["graph_servers"]])
    return cal.estimate(workload_of(config), setup, Prices.load())["epoch s"]


def test_estimate_predicts_a_larger_graph_and_another_server_count(configurations, capsys):
    cal = Calibration.from_record(str(configurations["calibration"]), SHARE_OF_THIS_MACHINE[2])
    for name in ("4x graph", "1 server"):
        measured, estimated = steady_epoch_s(configurations[name]), estimated_epoch_s(cal, configurations[name])
        with capsys.disabled():  # the errors, for the README (pytest -s)
            print(f"{name}: measured {measured:.4f} s an epoch, estimated {estimated:.4f} s "
                  f"({100 * (estimated / measured - 1):+.0f} %)")
        assert 1 / ALLOWED_FACTOR <= estimated / measured <= ALLOWED_FACTOR, (name, measured, estimated)
    measured, naive = steady_epoch_s(configurations["4x graph"]), steady_epoch_s(configurations["calibration"])
    estimated = estimated_epoch_s(cal, configurations["4x graph"])
    assert abs(math.log(estimated / measured)) < abs(math.log(naive / measured)), (measured, estimated, naive)
    # the CLI gives the same estimate, from the graph file's counts
    capsys.readouterr()
    config, *_ = read_record(configurations["4x graph"])
    assert main(["cost", "estimate", "--calibration", str(configurations["calibration"]), "--calibration-instance",
                 SHARE_OF_THIS_MACHINE[2], "--as-instance", SHARE_OF_THIS_MACHINE[2], "--backend", "cpu",
                 "--data", config["data"], "--graph-servers", "2", "--chunks", "2", "--tensor-threads", "1"]) == 0
    epoch_s = float(capsys.readouterr().out.splitlines()[-1].split()[4])
    assert epoch_s == pytest.approx(estimated_epoch_s(cal, configurations["4x graph"]), rel=1e-3, abs=1e-3)


def test_estimate_moves_with_server_speed_lambda_memory_and_edges():
    """Directions the model must get right, whatever its calibration."""
    cal = Calibration(graph_s_per_unit=1e-6, tensor_s_per_unit=1e-8, billed_per_measured=1.0, tasks_per_server_chunk=8,
                      startup_s=10.0, overlap=1.0, instance="c5.2xlarge", memory_mb=3008, source="hand")
    prices = Prices.load()
    work = Workload(nodes=1000, edges=100_000, dims=[100, 10, 5])
    setup = Setup("lambda", 2, 1, "c5.2xlarge", lambdas=4, memory_mb=2048, chunks=2, epochs=100)
    e = cal.estimate(work, setup, prices)
    assert cal.estimate(work, replace(setup, instance="c5.4xlarge"), prices)["epoch s"] < e["epoch s"]
    assert cal.estimate(work, replace(setup, memory_mb=512), prices)["epoch s"] > e["epoch s"]
    assert cal.estimate(replace(work, edges=200_000), setup, prices)["epoch s"] > e["epoch s"]
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
    (["cost", "estimate", "--nodes", "9", "--edges", "9", "--features", "9", "--classes", "2", "--edge-cut", "1.5"],
     "--edge-cut must be a fraction"),
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

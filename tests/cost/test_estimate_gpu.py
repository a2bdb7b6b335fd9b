"""GPU graph servers in the estimator: the GPU's speed-up applies to the dense tensor work and Gather (at
the same assumed factor unless told), not to the fixed cost per task, weight servers are priced as a CPU type, a GPU run's record
measures the speed-up, and --search puts GPU servers only beside CPU servers + Lambdas and CPU servers
only. No GPU here: the GPU records below are CPU runs relabelled, which is what makes their rates known."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from dorylus_py.cli import main
from dorylus_py.cost.estimate import Calibration, Setup, Workload, setup_of, vcpus, workload_of
from dorylus_py.cost.gpu import SEARCHED, GpuSpeed, comparison, gpu_of
from dorylus_py.cost.gpu_measured import gpu_speed_from_record
from dorylus_py.cost.model import Prices, read_record
from dorylus_py.data import write_npz
from dorylus_py.errors import ConfigError

CAL = Calibration(graph_s_per_unit=1e-7, tensor_s_per_unit=1e-8, billed_per_measured=1.0, tasks_per_server_chunk=8,
                  startup_s=10.0, overlap=1.0, instance="c5.2xlarge", memory_mb=3008, source="hand", task_s=0.002)
WORK = Workload(nodes=1_000_000, edges=20_000_000, dims=[128, 16, 10])
GPU = Setup("gpu", 2, 1, "g5.2xlarge", lambdas=0, memory_mb=3008, chunks=1, epochs=10, tensor_threads=2)
ARGS = ["cost", "estimate", "--nodes", "1000000", "--edges", "20000000", "--features", "128", "--classes", "10"]


def test_gpu_types_have_their_vcpus_gpus_and_prices():
    assert [vcpus(i) for i in ("g4dn.xlarge", "g4dn.2xlarge", "g5.4xlarge", "g6.xlarge", "p3.2xlarge")] == [4, 8, 16, 4, 8]
    assert [gpu_of(i) for i in ("g4dn.xlarge", "g5.xlarge", "g6.2xlarge", "p3.2xlarge", "c5.2xlarge")] == \
        ["T4", "A10G", "L4", "V100", None]
    prices = Prices.load()
    assert all(prices.hourly(i) > prices.hourly("c5.xlarge") for i in SEARCHED)  # every searched type is priced


def test_the_gpu_speeds_up_the_dense_tensor_work_only():
    """Split the epoch into its terms (every other rate 0): the dense part divides by the speed-up, the
    fixed cost per task by the host's tensor threads, Gather by the same speed-up (or a given factor)."""
    dense, fixed, gather = (replace(CAL, **{k: 0.0 for k in ("graph_s_per_unit", "tensor_s_per_unit", "task_s")
                                           if k != keep}) for keep in ("tensor_s_per_unit", "task_s", "graph_s_per_unit"))
    prices = Prices.load()

    def epoch(cal, setup=GPU, gpu=GpuSpeed()):
        return cal.estimate(WORK, setup, prices, gpu)["epoch s"]

    assert epoch(dense) == pytest.approx(1e-8 * WORK.tensor_units() / 2 / (10 * 600 / 900))  # A10G: 6.67x
    assert epoch(dense, gpu=GpuSpeed.given(4.0)) == pytest.approx(1e-8 * WORK.tensor_units() / 2 / 4)
    assert epoch(dense, replace(GPU, instance="g4dn.2xlarge")) / epoch(dense) == pytest.approx(600 / 320)
    tasks = 8 * 2 * 1
    assert epoch(fixed) == pytest.approx(0.002 * tasks / 2 / 2)  # g5.2xlarge's 8 vCPUs: the calibration's speed
    assert epoch(fixed, gpu=GpuSpeed.given(100.0)) == epoch(fixed)
    assert epoch(gather) == pytest.approx(1e-7 * WORK.graph_units(2) / (10 * 600 / 900))  # on the A10G
    assert epoch(gather, gpu=GpuSpeed.given(100.0)) == pytest.approx(epoch(gather) * (10 * 600 / 900) / 100)
    assert epoch(gather, replace(GPU, instance="g5.xlarge")) == pytest.approx(epoch(gather))  # vCPUs do not matter
    assert epoch(gather, gpu=GpuSpeed.given(None, 5.0)) == pytest.approx(1e-7 * WORK.graph_units(2) / 5)
    cpu = replace(GPU, backend="cpu", instance="c5.2xlarge")
    assert epoch(dense, cpu) == pytest.approx(1e-8 * WORK.tensor_units() / (2 * 2))  # the same work on 2 threads


def test_weight_servers_beside_gpus_are_priced_as_a_cpu_type():
    prices = Prices.load()
    est = CAL.estimate(WORK, GPU, prices)
    hours = est["wall s"] / 3600
    assert est["servers $"] == pytest.approx(hours * (2 * prices.hourly("g5.2xlarge") + prices.hourly("c5.xlarge")))
    chosen = CAL.estimate(WORK, replace(GPU, weight_instance="c5.2xlarge"), prices)
    assert chosen["servers $"] == pytest.approx(hours * (2 * prices.hourly("g5.2xlarge") + prices.hourly("c5.2xlarge")))
    cpu = CAL.estimate(WORK, replace(GPU, backend="cpu", instance="c5.4xlarge"), prices)
    assert cpu["servers $"] == pytest.approx(cpu["wall s"] / 3600 * 3 * prices.hourly("c5.4xlarge"))


def test_search_compares_gpu_servers_only_with_cpu_servers_and_lambdas(capsys):
    assert main([*ARGS, "--search", "--top", "2", "--epochs", "50"]) == 0
    out = capsys.readouterr().out
    assert "assumed (no GPU calibration)" in out and "V100 10x" in out and "T4 3.56x" in out
    table = out.split("the best value of each kind")[1].splitlines()[2:]
    names = ("CPU servers + Lambdas", "CPU servers only", "GPU servers only")
    kinds = {k: line.split(k)[1].split() for line in table for k in names if k in line}  # the cells after the kind
    assert set(kinds) == set(names) and len(table) == 3
    gpu_row = kinds["GPU servers only"]
    assert gpu_row[0] == "gpu" and gpu_row[2] in SEARCHED and kinds["CPU servers only"][0] == "cpu"
    value = {k: float(r[-2].replace(",", "")) for k, r in kinds.items()}  # 10,570
    assert float(gpu_row[-1].rstrip("x")) == pytest.approx(value["GPU servers only"] / value["CPU servers + Lambdas"],
                                                           rel=0.01)
    # a GPU 10x as fast as the default's fastest gives GPU servers a better value than before
    assert main([*ARGS, "--search", "--top", "1", "--epochs", "50", "--gpu-speedup", "100"]) == 0
    faster = capsys.readouterr().out.split("the best value of each kind")[1].splitlines()
    gpu_value = next(l for l in faster if l.strip().startswith("GPU")).split()[-2]
    assert float(gpu_value.replace(",", "")) > value["GPU servers only"]


def test_comparison_takes_the_best_value_of_each_kind():
    rows = [{"backend": "lambda", "value": 2.0}, {"backend": "lambda", "value": 4.0}, {"backend": "gpu", "value": 1.0},
            {"backend": "cpu", "value": 3.0}, {"backend": "local", "value": 9.0}]
    got = comparison(rows)
    assert [(r["kind"], r["value"], r["value vs lambda"]) for r in got] == [
        ("CPU servers + Lambdas", 4.0, 1.0), ("CPU servers only", 3.0, 0.75), ("GPU servers only", 1.0, 0.25)]


@pytest.fixture(scope="module")
def cpu_and_gpu_records(tmp_path_factory, small_graph):
    """A real `cpu` run, and a copy of it relabelled `--backend gpu`: a GPU record whose rates are known."""
    root = tmp_path_factory.mktemp("gpu")
    write_npz(small_graph, root / "g.npz")
    assert main(["train", "--backend", "cpu", "--data", str(root / "g.npz"), "--graph-servers", "2", "--chunks", "2",
                 "--tensor-threads", "2", "--epochs", "4", "--quiet", "--out", str(root / "cpu")]) == 0
    shutil.copytree(root / "cpu", root / "gpu")
    config = json.loads((root / "gpu" / "config.json").read_text())
    (root / "gpu" / "config.json").write_text(json.dumps(config | {"backend": "gpu"}))
    return root / "cpu", root / "gpu"


def test_a_gpu_record_measures_the_speed_up(cpu_and_gpu_records, capsys):
    """The same tasks as a GPU's: its 2 threads shared one GPU, so that GPU did 2 workers' work (speed-up 2),
    and a gpu estimate on a type of the calibration's vCPUs equals the cpu estimate of the run."""
    cpu_dir, gpu_dir = cpu_and_gpu_records
    cal = Calibration.from_record(str(cpu_dir), "c5.2xlarge")
    gpu_cal = Calibration.from_record(str(gpu_dir), "g5.2xlarge")
    assert gpu_cal.overlap == pytest.approx(cal.overlap) and gpu_cal.tensor_s_per_unit == cal.tensor_s_per_unit
    speed = gpu_speed_from_record(cal, str(gpu_dir), "g5.2xlarge")
    assert speed.speedup("g5.xlarge") == pytest.approx(2.0) and "measured" in speed.source
    assert speed.speedup("p3.2xlarge") == pytest.approx(2.0 * 900 / 600)
    config = read_record(cpu_dir)[0]
    work, setup, prices = workload_of(config), setup_of(config, "c5.2xlarge"), Prices.load()
    on_gpu = cal.estimate(work, replace(setup, backend="gpu", instance="g5.2xlarge"), prices, speed)
    on_cpu = cal.estimate(work, setup, prices)
    assert on_gpu["epoch s"] == pytest.approx(on_cpu["epoch s"], rel=1e-9)
    capsys.readouterr()
    assert main([*ARGS, "--calibration", str(cpu_dir), "--backend", "gpu", "--as-instance", "g4dn.xlarge",
                 "--gpu-calibration", str(gpu_dir), "--gpu-calibration-instance", "g5.2xlarge"]) == 0
    assert "T4 1.07x; measured on g5.2xlarge (A10G)" in capsys.readouterr().out  # 2 x 320 / 600


@pytest.mark.parametrize("extra, message", [
    (["--backend", "gpu"], "needs a GPU instance type"),
    (["--backend", "gpu", "--as-instance", "g5.xlarge", "--gpu-speedup", "0"], "--gpu-speedup must be a positive"),
    (["--backend", "gpu", "--as-instance", "g5.xlarge", "--gpu-gather-speedup", "-1"], "--gpu-gather-speedup must"),
    (["--weight-instance", "z9.huge"], "no price for instance type 'z9.huge'"),
    (["--gpu-calibration", "/nonexistent"], "--gpu-calibration-instance"),
])
def test_bad_gpu_input_exit_2(extra, message, capsys):
    assert main([*ARGS, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_records_in_the_wrong_place_exit_2(cpu_and_gpu_records, capsys):
    cpu_dir, gpu_dir = cpu_and_gpu_records
    assert main([*ARGS, "--calibration", str(gpu_dir)]) == 2
    assert "give a --backend gpu run as --gpu-calibration" in capsys.readouterr().err
    assert main([*ARGS, "--gpu-calibration", str(cpu_dir), "--gpu-calibration-instance", "g5.xlarge"]) == 2
    assert "needs a --backend gpu run, not 'cpu'" in capsys.readouterr().err
    assert main([*ARGS, "--gpu-calibration", str(gpu_dir), "--gpu-calibration-instance", "c5.xlarge"]) == 2
    assert "has no GPU" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="needs a GPU instance"):
        CAL.estimate(WORK, replace(GPU, instance="c5.2xlarge"), Prices.load())

"""The Python API: `from dorylus_py import train, predict, TrainConfig` runs what `dorylus train` runs and
returns what its record holds; a user's mistake raises the typed error whose message the CLI prints."""

import json
import subprocess
import sys

import numpy as np
import pytest

from dorylus_py import ConfigError, DataError, DorylusError, TrainConfig, predict, train
from dorylus_py.cli import main
from dorylus_py.training.record import read_lines

TIMINGS = ("wall_s", "median_epoch_s", "job_s")


def test_a_3_epoch_job_returns_the_numbers_of_the_clis_summary(graph_npz, tmp_path, capsys):
    run = train(TrainConfig(data=str(graph_npz), epochs=3, model="sage"), out=tmp_path / "api", hidden=8)
    assert run.summary == json.loads((tmp_path / "api" / "summary.json").read_text())
    assert run.metrics == read_lines(tmp_path / "api" / "metrics.jsonl") and len(run.metrics) == 3
    assert run.best_epoch == max(run.metrics, key=lambda r: (r["val_acc"], -r["epoch"]))["epoch"]
    assert run.test_acc == run.metrics[run.best_epoch - 1]["test_acc"]
    assert main(["train", "--data", str(graph_npz), "--epochs", "3", "--model", "sage", "--hidden", "8", "--quiet",
                 "--out", str(tmp_path / "cli")]) == 0
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert {k: v for k, v in run.summary.items() if k not in TIMINGS} == {k: v for k, v in cli.items()
                                                                           if k not in TIMINGS}
    assert f"at epoch {cli['best_epoch']}" in capsys.readouterr().out
    config = json.loads((tmp_path / "api" / "config.json").read_text())
    assert config["model"] == "sage" and config["hidden"] == 8 and config["epochs"] == 3
    assert run.predict().accuracy("test") == run.test_acc
    np.testing.assert_array_equal(predict(run.run_dir, weights="final").logits, run.predict(weights="final").logits)


def test_a_distributed_job_runs_through_the_api(graph_npz, tmp_path):
    run = train(data=str(graph_npz), epochs=2, backend="cpu", graph_servers=2, out=tmp_path / "run")
    assert run.summary["status"] == "completed" and run.summary["backend"] == "cpu" and len(run.metrics) == 2
    assert (tmp_path / "run" / "partitions" / "manifest.json").exists()


@pytest.mark.parametrize("settings,error", [
    ({"epochs": 0}, ConfigError),
    ({"dropout": 1.5}, ConfigError),
    ({"backend": "cpu", "graph_servers": 2, "remat": True, "mode": "async"}, ConfigError),
    ({"data": "missing.npz"}, DataError),
])
def test_a_mistake_raises_the_typed_error_with_the_clis_line(graph_npz, tmp_path, capsys, settings, error):
    settings = {"data": str(graph_npz), "epochs": 2} | settings
    with pytest.raises(error) as raised:
        train(TrainConfig(**settings), out=tmp_path / "api")
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in settings.items()]
    assert main(["train", *flags, "--quiet", "--out", str(tmp_path / "cli")]) == 2
    assert capsys.readouterr().err == f"error: {raised.value}\n"
    assert isinstance(raised.value, DorylusError)


def test_a_run_that_fails_ends_its_record_as_the_cli_does(graph_npz, tmp_path, monkeypatch):
    from dorylus_py.models.gcn import GCN

    forward, calls = GCN.forward, []

    def failing_forward(self, *args, **kwargs):  # the fourth forward (epoch 2's evaluation) meets bad data
        calls.append(1)
        if len(calls) == 4:
            raise DataError("features.npy: row 17 is not finite")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(GCN, "forward", failing_forward)
    with pytest.raises(DataError, match="row 17"):
        train(data=str(graph_npz), epochs=3, out=tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed: features.npy: row 17 is not finite" and summary["epochs"] == 1
    with pytest.raises(ConfigError, match="run folder exists and is not empty"):
        train(data=str(graph_npz), epochs=1, out=tmp_path / "run")
    with pytest.raises(TypeError, match="no setting 'epoch'"):
        train(data=str(graph_npz), epoch=1, out=tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_importing_the_package_loads_neither_numpy_nor_torch():
    code = "import sys, dorylus_py; dorylus_py.TrainConfig; print('numpy' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.split() == ["False", "False"]

"""The scale model from the command line: a model that cannot run says why in one line and exits 2,
before anything is written; one that can leaves D, raw and model times in its record, and each host's
CPU use in hosts.json; `dorylus report` says the run was a scale model."""

from __future__ import annotations

import json

import pytest

from dorylus_py.cli import main


def test_a_model_that_does_not_fit_is_refused_naming_the_sum(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--backend", "cpu", "--graph-servers", "2", "--host-cpus", "2", "--dilation", "1",
                 "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "sum of C/D over 3 hosts is 6.00 cores" in err[0], err
    assert not out.exists()


def test_dilation_without_cpu_groups_is_refused(tmp_path, capsys):
    code = main(["train", "--backend", "cpu", "--dilation", "4", "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 2 and "--dilation needs --host-cpus" in capsys.readouterr().err


def test_the_lab_refuses_a_model_that_does_not_fit(tmp_path, capsys):
    from dorylus_py.lab.__main__ import main as lab

    parts = tmp_path / "parts"
    assert main(["synth", "--nodes", "300", "--edges", "1500", "--out", str(tmp_path / "g.npz")]) == 0
    assert main(["prepare", str(tmp_path / "g.npz"), "-k", "2", "--out", str(parts)]) == 0
    capsys.readouterr()
    assert lab(["run", "--data", str(parts), "--out", str(tmp_path / "run"), "--host-cpus", "1"]) == 2
    assert "the scale model does not fit" in capsys.readouterr().err


@pytest.mark.cgroups
def test_a_dilated_local_run_records_model_times_and_hosts(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--backend", "local", "--lambdas", "2", "--epochs", "2", "--host-cpus", "0.6",
                 "--weight-host-cpus", "0.4", "--lambda-vcpus", "0.4", "--dilation", "2", "--out", str(out),
                 "--quiet"]) == 0
    config, summary = (json.loads((out / f).read_text()) for f in ("config.json", "summary.json"))
    assert config["dilation"] == 2.0 and config["lambda_latency_ms"] == 0.0
    assert summary["model_wall_s"] == pytest.approx(summary["wall_s"] / 2)
    hosts = json.loads((out / "hosts.json").read_text())["hosts"]
    assert set(hosts) == {"graph-server-0", "graph-server-1", "weight-server-0", "lambdas"}
    assert hosts["lambdas"]["hosts"] == 2 and all(h["cpu_s"] > 0 for h in hosts.values())
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "a scale model at dilation 2" in capsys.readouterr().out

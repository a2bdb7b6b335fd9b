"""Claims (b) and (c) of the scale model: a whole job at D = 1, 2 and 4 (two graph-server hosts, a
weight-server host, ``--backend cpu``) has the same model epoch times (raw / D) and the same per-epoch
losses; and a job at D = 4 whose emulated Lambda is killed recovers with the same losses (its timeouts
stretched with it).

What the model controls is the time a host gets per CPU second of work (its quota, every timeout and
link): the model epoch per graph-server CPU second is checked within the issue's 10 %. What it cannot
control is how many CPU seconds the box charges for the same work at a smaller share: on the VMs this
project runs on, a memory-bound kernel with 0.15 of a core costs 20-40 % more CPU time than the same
kernel with 0.6 (docs/lab.md, "Measured error", measured without any of this project's code), so the
raw model epoch at D = 4 reads 13-33 % slow there (and from 16 % fast to 2 % slow on a loaded box; 83 % slow once, in
CI on 2026-12-06, with the time per CPU second within 3 %). The raw ratio is checked only to lie between 0.9 and
(1 + D) / 2: without quotas it is about 0.3, with durations dilated twice about D or more.

The hosts are 0.6 cores per graph server and 0.4 for the weight server, not the issue's 0.8 each:
at D = 1 the model must fit 90 % of this box's two cores (1.6 of 1.8), and at D = 4 a host's quota
must stay above the kernel's 1 ms a 10 ms period (0.4 / 4 = 0.1 core)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from dorylus_py.cli import main

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

EPOCHS = 12
HOSTS = ["--host-cpus", "0.6", "--weight-host-cpus", "0.4"]
JOB = ["--epochs", str(EPOCHS), "--hidden", "128", "--dropout", "0", "--feature-norm", "none", "--checkpoint-every", "0"]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scale-data")
    assert main(["synth", "--nodes", "20000", "--edges", "300000", "--out", str(root / "g.npz")]) == 0
    assert main(["prepare", str(root / "g.npz"), "-k", "2", "--out", str(root / "parts")]) == 0
    return root / "parts"


def run_job(data: Path, out: Path, d: float, *flags: str) -> tuple[list[float], float, dict]:
    assert main(["train", "--data", str(data), "--out", str(out), "--quiet", "--dilation", str(d), *HOSTS, *JOB,
                 *flags]) == 0
    summary = json.loads((out / "summary.json").read_text())
    steady = statistics.median(r["epoch_s"] for r in rows(out)[2:])  # the first epoch carries start-up
    print(f"D={d:g} epoch s:", [round(r["epoch_s"], 3) for r in rows(out)], "job s", round(summary["job_s"], 1))
    return [r["loss"] for r in rows(out)], steady / d, summary


def server_cpu_s(run: Path) -> float:
    """The graph servers' CPU seconds in a steady epoch (median of epochs 2 on), all of their threads."""
    return statistics.median(sum(s["cpu_s"] for s in r["servers"]) for r in rows(run)[2:])


def test_model_epoch_times_and_losses_match_d1(data, tmp_path):
    losses, model, per_cpu_s = {}, {}, {}
    for d in (1.0, 2.0, 4.0):
        losses[d], model[d], summary = run_job(data, tmp_path / f"d{d:g}", d, "--backend", "cpu")
        per_cpu_s[d] = model[d] / server_cpu_s(tmp_path / f"d{d:g}")
        if d > 1:
            assert summary["dilation"] == d and summary["model_wall_s"] == pytest.approx(summary["wall_s"] / d)
    print("model epoch s by D:", {d: round(t, 4) for d, t in model.items()},
          "per graph-server CPU s:", {d: round(t, 3) for d, t in per_cpu_s.items()})
    assert losses[2.0] == losses[1.0] and losses[4.0] == losses[1.0]
    for d in (2.0, 4.0):
        assert per_cpu_s[d] == pytest.approx(per_cpu_s[1.0], rel=0.10), per_cpu_s  # the 10 %
        assert 0.9 < model[d] / model[1.0] < (1 + d) / 2, model  # the box's CPU cost per work, not the model


def test_a_killed_lambda_at_d4_recovers_with_identical_losses(data, tmp_path):
    """An emulated Lambda that dies mid-task (--lambda-fail-rate kills its invocation) is relaunched after
    the dilated relaunch timeout; the losses are the undisturbed run's."""
    flags = ["--backend", "local", "--lambdas", "2", "--lambda-vcpus", "0.6", "--epochs", "4"]
    clean, _, _ = run_job(data, tmp_path / "clean", 4.0, *flags)
    failing, _, summary = run_job(data, tmp_path / "failing", 4.0, *flags, "--lambda-fail-rate", "0.1")
    assert summary["relaunches"] > 0
    assert failing == clean

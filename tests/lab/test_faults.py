"""Faults across hosts: in each, a sync job's per-epoch losses equal the undisturbed job's on one
machine, and every server's memory and open file descriptors stay bounded."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dorylus_py.lab.cluster import LabCluster, Placement
from dorylus_py.lab.shaping import Link
from tests.lab.conftest import JOB, MAX_FDS, MAX_MB, losses

pytestmark = pytest.mark.lab

def after_first_epoch(lab: LabCluster, run: Path, job: subprocess.Popen, timeout_s: float = 300) -> None:
    """Wait until the job has recorded an epoch (a fault then lands mid-job)."""
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + timeout_s
    while not (metrics.exists() and metrics.read_text().strip()):
        assert job.poll() is None, lab.log("driver")[-2000:]
        assert time.monotonic() < deadline, "no epoch within the deadline"
        time.sleep(0.1)


def epoch_seconds(run: Path) -> list[float]:
    return [json.loads(line)["epoch_s"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def bounded(peaks: dict, extra_fds: int = 0) -> bool:
    roles = {"weight-server-0", "graph-server-0", "graph-server-1", "lambda-service"}
    return set(peaks) == roles and all(mb < MAX_MB and fds < MAX_FDS + extra_fds for mb, fds in peaks.values())


def finished(lab: LabCluster, job: subprocess.Popen, timeout_s: float = 400) -> None:
    assert job.wait(timeout=timeout_s) == 0, lab.log("driver")[-2000:]


@pytest.mark.long
def test_the_lambda_hosts_cable_pulled_for_10_s(lab_data, one_machine, tmp_path):
    """Every Lambda cut off from the servers, and the servers from the Lambda API, for 10 s: invocations
    fail to connect and are retried, tasks in flight wait or are relaunched; the job goes on."""
    with LabCluster(tmp_path, Placement.standard(2), curve=True) as lab:
        with lab.peak_usage() as peaks:
            job = lab.start_train(lab_data, tmp_path / "run", lab.lambda_flags() + JOB)
            after_first_epoch(lab, tmp_path / "run", job)
            lab.net.set_cable("d", False)
            time.sleep(10)  # the fault itself, not a wait for something to happen
            lab.net.set_cable("d", True)
            finished(lab, job)
    assert np.allclose(losses(tmp_path / "run"), one_machine, rtol=0, atol=1e-6)
    assert max(epoch_seconds(tmp_path / "run")) > 5  # the outage came mid-job
    assert bounded(peaks), peaks


@pytest.mark.long
def test_two_percent_loss_on_every_link(lab_data, one_machine, tmp_path):
    lossy = [Link(x, y, loss_pct=2) for x, y in itertools.combinations("abcd", 2)]
    with LabCluster(tmp_path, Placement.standard(2), lossy, curve=True) as lab:
        with lab.peak_usage() as peaks:
            finished(lab, lab.start_train(lab_data, tmp_path / "run", lab.lambda_flags() + JOB))
        assert sum(lab.net.dropped(h) for h in "abcd") > 5  # the loss was there (2 % of some thousand packets)
    assert np.allclose(losses(tmp_path / "run"), one_machine, rtol=0, atol=1e-6)
    assert bounded(peaks), peaks


@pytest.mark.long
def test_a_hostile_host_on_the_bridge(lab_data, one_machine, tmp_path):
    """Host e, without the keys, scans every port of the other hosts, sends junk into the open ones,
    floods them with unfinished 64 MB multipart frames and refused CURVE clients, and holds 1,000 idle
    connections open, for the whole job. CURVE and ZAP are on, as a job on a shared network should run."""
    with LabCluster(tmp_path, Placement.standard(2), curve=True, extra_hosts=["e"]) as lab:
        lab.wait_listening()  # then the first round finds every server, and holds its idle connections at them
        targets = ",".join(lab.net.ips[h] for h in "abcd")
        hostile = lab.net.popen("e", [sys.executable, "-m", "dorylus_py.lab.hostile", "--hosts", targets, "--ports",
                                      "1-1024,7000-7300,9000", "--idle", "1000", "--curve-server-key",
                                      lab.public_key], stdout=subprocess.PIPE, text=True)
        assert hostile.stdout.readline().strip() == "attacking"  # (it exits, so the read ends, if it fails)
        with lab.peak_usage() as peaks:
            finished(lab, lab.start_train(lab_data, tmp_path / "run", lab.lambda_flags() + JOB))
        hostile.send_signal(signal.SIGTERM)
        did = json.loads(hostile.communicate(timeout=60)[0].strip().splitlines()[-1])
    assert np.allclose(losses(tmp_path / "run"), one_machine, rtol=0, atol=1e-6)
    for role in ("graph-server-0", "graph-server-1", "weight-server-0"):  # its CURVE clients met ZAP, and lost
        assert f"refused a connection from {lab.net.ips['e']} (client key not admitted" in lab.log(role), role
    ports = {port for _, port in did["open"]}
    assert {7100, 7101, 7200, 9000} <= ports and did["rounds"] >= 1 and did["idle_held"] >= 1000, did
    assert bounded(peaks, extra_fds=1000), peaks  # a ZeroMQ server holds at most what the attacker holds open
    assert peaks["lambda-service"][1] < MAX_FDS  # the service keeps 64 connections a peer


def lost_and_back(lab_data, one_machine, tmp_path, fault) -> None:
    """A job whose graph server 0 (host b) is lost for a while mid-job, by ``fault(lab)``."""
    with LabCluster(tmp_path, Placement.standard(2), curve=True) as lab:
        with lab.peak_usage() as peaks:
            job = lab.start_train(lab_data, tmp_path / "run", lab.lambda_flags() + JOB + [
                "--checkpoint-every", "1", "--replace-timeout-s", "120"])
            after_first_epoch(lab, tmp_path / "run", job)
            fault(lab)
            finished(lab, job)
    assert np.allclose(losses(tmp_path / "run"), one_machine, rtol=0, atol=1e-6)
    assert bounded(peaks), peaks


@pytest.mark.long
def test_a_graph_servers_cable_pulled_for_10_s(lab_data, one_machine, tmp_path):
    """Longer than the 6 s after which a silent server is presumed dead (and the server exits, and its
    supervisor starts it again): the driver must wait for rank 0 to say hello again and resume."""
    def pull(lab: LabCluster) -> None:
        lab.net.set_cable("b", False)
        time.sleep(10)  # the fault itself
        lab.net.set_cable("b", True)

    lost_and_back(lab_data, one_machine, tmp_path, pull)


@pytest.mark.long
def test_a_graph_servers_host_killed_whole_and_booted_again(lab_data, one_machine, tmp_path):
    """Every process on host b (the supervisor, graph server 0, whatever it started) killed at once; the
    machine boots again and its supervisor starts graph server 0, which says hello to the driver."""
    def power_cut(lab: LabCluster) -> None:
        lab.kill_host("b")
        lab.boot("b")

    lost_and_back(lab_data, one_machine, tmp_path, power_cut)

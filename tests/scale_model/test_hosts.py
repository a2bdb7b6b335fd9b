"""The scale model's pure parts: hosts' shares, fit and placement (hosts.py), and time (timescale.py)."""

from __future__ import annotations

import dataclasses

import pytest

from dorylus_py import timescale
from dorylus_py.config import TrainConfig
from dorylus_py.errors import ConfigError
from dorylus_py.hosts import Host, check_fit, job_hosts, lambda_vcpus, period_quota_us, place
from dorylus_py.settings import AUTO


def test_lambda_vcpus_follow_memory_as_on_aws():
    assert lambda_vcpus(1769) == pytest.approx(1.0)
    assert lambda_vcpus(3008) == pytest.approx(1.70, abs=0.01)
    assert lambda_vcpus(10240) == pytest.approx(5.79, abs=0.01) and lambda_vcpus(12000) == 6.0
    assert lambda_vcpus(3008, asked=0.5) == 0.5


def test_a_model_that_does_not_fit_is_refused_naming_the_sum():
    hosts = [Host("g0", 1.0), Host("g1", 1.0), Host("w", 0.5)]
    assert check_fit(hosts, 4.0, 2) == pytest.approx(0.625)
    with pytest.raises(ConfigError, match="is 2.50 cores, above 90% of this box's 2"):
        check_fit(hosts, 1.0, 2)


def test_quota_is_c_over_d_of_the_period_the_period_longer_below_a_millisecond():
    assert period_quota_us(1.0, 4.0, 10_000) == (10_000, 2500)
    assert period_quota_us(0.8, 1.0, 10_000) == (10_000, 8000)
    assert period_quota_us(0.2, 4.0, 10_000) == (20_000, 1000)  # 0.05 core


def test_whole_cores_where_they_fit_else_none():
    assert place([0.8, 0.8, 0.2], [0, 1]) == [[0], [1], [0]]
    assert place([1.5, 0.6], [0, 1]) == [[0, 1], None]  # 0.75 a core on both: 0.6 more fits on neither
    assert place([3.0], [0, 1]) == [None]


def test_job_hosts_name_every_server_and_lambda():
    cfg = TrainConfig(host_cpus=1.0, weight_host_cpus=0.25, lambda_vcpus=0.5)
    hosts = job_hosts(cfg, 2, 1, 4)
    assert [h.name for h in hosts] == ["graph-server-0", "graph-server-1", "weight-server-0",
                                       "lambda-0", "lambda-1", "lambda-2", "lambda-3"]
    assert sum(h.cores for h in hosts) == pytest.approx(4.25)
    assert job_hosts(TrainConfig(), 2, 1, 4) == []


def test_dilate_stretches_every_duration_and_slows_every_rate(monkeypatch):
    cfg = TrainConfig(lambda_latency_ms=20.0, lambda_bandwidth_mbps=200.0, hang_timeout_s=60.0)
    d = timescale.dilate(cfg, 4.0)
    assert (d.lambda_latency_ms, d.lambda_bandwidth_mbps, d.hang_timeout_s) == (80.0, 50.0, 240.0)
    assert d.relaunch_min_s == 4 * cfg.relaunch_min_s and d.epochs == cfg.epochs
    assert timescale.dilate(cfg, 1.0) is cfg
    assert timescale.dilate(cfg, 4.0).fresh_wait_ms is AUTO  # auto is the plan's to resolve, before dilate
    planned = dataclasses.replace(cfg, fresh_wait_ms=50.0)  # as the CLI's plan resolves it in async mode
    assert timescale.dilate(planned, 4.0).fresh_wait_ms == 200.0


def test_one_setting_in_the_environment(monkeypatch):
    monkeypatch.delenv(timescale.ENV, raising=False)
    assert timescale.scaled(6.0) == 6.0
    monkeypatch.setenv(timescale.ENV, "4")
    assert timescale.scaled(6.0) == 24.0 and timescale.scaled_ms(500) == 2000 and timescale.model_s(8.0) == 2.0
    with pytest.raises(ConfigError, match="disagrees"):
        timescale.export(2.0)
    monkeypatch.setenv(timescale.ENV, "fast")
    with pytest.raises(ConfigError, match="DORYLUS_DILATION must be a number"):
        timescale.dilation()
    with pytest.raises(ConfigError, match="^dilation must be a number in"):
        TrainConfig(dilation=0.5).check()


def test_model_view_divides_raw_times_by_d():
    metrics = [{"epoch": 1, "epoch_s": 4.0, "wall_s": 4.0, "loss": 1.0}]
    tasks = [{"start": 8.0, "end": 12.0, "billed_ms": 4000}]
    m, t, s = timescale.model_view(4.0, metrics, tasks, {"wall_s": 4.0, "median_epoch_s": 4.0})
    assert m[0]["epoch_s"] == 1.0 and m[0]["loss"] == 1.0 and t[0]["billed_ms"] == 1000 and s["wall_s"] == 1.0
    assert metrics[0]["epoch_s"] == 4.0  # the record's rows are left as they are
    assert timescale.model_times(4.0, {"wall_s": 8.0}) == {"dilation": 4.0, "model_wall_s": 2.0}

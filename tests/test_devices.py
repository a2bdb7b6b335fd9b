"""--device for the graph servers' tensor threads: one for all, or one per server; ``cuda`` takes the next
GPU of each host; the device is checked on the host that uses it, not on a --cluster job's driver."""

import pytest

from dorylus_py.cli import main
from dorylus_py.config import TrainConfig
from dorylus_py.devices import device_for, device_list, local_rank
from dorylus_py.errors import ConfigError

SERVERS = ["tcp://10.0.0.1:7000", "tcp://10.0.0.1:7001", "tcp://10.0.0.2:7000", "tcp://10.0.0.1:7002"]


def test_cuda_takes_the_next_gpu_of_each_host():
    ranks = [local_rank(SERVERS, k) for k in range(4)]
    assert ranks == [0, 1, 0, 2] and local_rank([], 3) == 3
    assert [device_for("cuda", "gpu", k, r, 2) for k, r in enumerate(ranks)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:0"]
    assert device_for("", "gpu", 1, 1, 4) == "cuda:1" and device_for("", "cpu", 3, 2, 0) == "cpu"


def test_a_list_gives_each_server_its_own_and_an_index_is_checked_against_the_host():
    assert [device_for("cuda:1,cpu,cuda", "gpu", k, k, 2) for k in range(3)] == ["cuda:1", "cpu", "cuda:0"]
    with pytest.raises(ConfigError, match="its host has 2 CUDA device"):
        device_for("cuda:2", "gpu", 0, 0, 2)
    with pytest.raises(ConfigError, match="no CUDA device on its host"):
        device_for("cpu,cuda", "gpu", 1, 1, 0)
    assert device_for("cpu,cuda", "gpu", 0, 0, 0) == "cpu"  # server 0's host needs no GPU


@pytest.mark.parametrize("value", ["gpu", "cuda:", "cuda:x", "cpu,,cpu", "CUDA", "cuda:1234"])
def test_misspelt_devices_are_refused(value):
    with pytest.raises(ConfigError, match="is not cpu, cuda or cuda:N"):
        device_list(value)


def test_the_driver_checks_spelling_and_count_but_not_its_own_gpus(tmp_path, capsys):
    TrainConfig(backend="gpu", graph_servers=2, device="cuda:0,cuda:1").check()  # a --cluster job's driver
    with pytest.raises(ConfigError, match="lists 3 devices for 2 graph servers"):
        TrainConfig(backend="cpu", graph_servers=2, device="cpu,cpu,cpu").check()
    with pytest.raises(ConfigError, match="not a list"):
        TrainConfig(mode="gossip", device="cpu,cpu").check()
    import torch

    if not torch.cuda.is_available():  # servers the driver starts itself: checked here, before any starts
        assert main(["train", "--backend", "gpu", "--epochs", "1", "--out", str(tmp_path / "run")]) == 2
        assert "torch sees no CUDA device" in capsys.readouterr().err and not (tmp_path / "run").exists()

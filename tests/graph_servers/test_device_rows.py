"""The graph stages' device path, run on the CPU (issue 33): with ``DORYLUS_DEVICE_COPIES=1`` a graph
server keeps device twins of its buffers as a GPU does, so these tests see what a GPU would compute on.
Here: twins alias as their buffers do; every op of every graph stage reads and writes twins only (an op
on a host buffer would run on the host beside a GPU); and the stages' results equal the host-only
path's. Whole runs against the reference: tests/cluster/test_device_copies.py."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from graph_servers.device_rows import COPIES_ENV, DeviceRows
from graph_servers.graph_state import FusedInput, GraphState

VIEWS = {"aten.slice.Tensor", "aten.select.int", "aten.as_strided.default", "aten.alias.default",
         "aten.view.default", "aten.t.default", "aten.detach.default", "aten.lift_fresh.default"}  # no data touched
# (lift_fresh: torch.from_numpy)


def test_twins_alias_as_their_buffers_do(monkeypatch):
    monkeypatch.setenv(COPIES_ENV, "1")
    dev = DeviceRows("cpu")
    flat = dev.zeros(12)
    a, b = flat[:12].reshape(3, 4), flat[:6].reshape(2, 3)  # remat's sharing: views of one buffer's start
    dev.track([a, b])
    assert dev.twin_bytes == 48
    a[1] = 7.0
    dev.upload(a, slice(1, 2))
    assert dev.twin(b)[1].tolist() == [0.0, 7.0, 7.0]  # b's row 1 is elements 3..5, a's row 1 starts at 4
    assert dev.twin(b).data_ptr() != b.ctypes.data  # a copy, not the host buffer
    dev.twin(a)[2] = 5.0
    assert a[2].tolist() == [0.0] * 4  # not on the host until downloaded
    dev.download(a, slice(2, 3))
    assert a[2].tolist() == [5.0] * 4
    with pytest.raises(ValueError, match="no device twin"):
        dev.twin(np.zeros((2, 2), np.float32))


def test_without_copies_the_twin_is_the_buffer(monkeypatch):
    monkeypatch.delenv(COPIES_ENV, raising=False)
    dev = DeviceRows("cpu")
    a = dev.zeros(3, 4)
    dev.track([a])
    assert dev.twin(a).data_ptr() == a.ctypes.data and dev.twin_bytes == 0


class HostOps(TorchDispatchMode):
    """The ops that touch host buffers' memory, apart from views and the copies to and from twins."""

    def __init__(self, buffers):
        super().__init__()
        self.spans = [(b.ctypes.data, b.ctypes.data + b.nbytes) for b in buffers]
        self.bad: list[str] = []

    def _host(self, t) -> bool:
        return (isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type == "cpu"
                and any(lo <= t.data_ptr() < hi for lo, hi in self.spans))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        hosts = [t for t in tree_flatten((args, kwargs))[0] if self._host(t)]
        copy = str(func) == "aten.copy_.default" and len(hosts) == 1
        if hosts and str(func) not in VIEWS and not copy:
            self.bad.append(str(func))
        return func(*args, **(kwargs or {}))


def states(graph, tmp_path, model, monkeypatch):
    """``(host-only, with twins)``: one partition's state each way, the same random rows in both."""
    prepare(graph, tmp_path / "p", 2)
    spec = model_spec(model, [graph.num_features, 8, graph.num_classes], heads=2)
    out = []
    for copies in ("0", "1"):
        monkeypatch.setenv(COPIES_ENV, copies)
        fused = FusedInput(0.5, 1, 0) if model == "gcn" else None  # GCN's last layer fused: its graph stages too
        s = GraphState(PartitionStore.open(tmp_path / "p").load(0), spec, [2, 2], "none", fused=fused)
        rng = np.random.default_rng(0)
        for buffer in s._buffers():
            buffer[:] = rng.standard_normal(buffer.shape, np.float32)
            s.dev.upload(buffer)
        out.append(s)
    return out


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_graph_stages_compute_on_the_twins_and_equal_the_host_path(model, small_graph, tmp_path, monkeypatch):
    host, twins = states(small_graph, tmp_path, model, monkeypatch)
    assert twins.dev.copies and not host.dev.copies
    last = {"gcn": [("activate", 1), ("activate_bwd", 1)], "sage": [], "gat": [("attn_grad", 0), ("attn_grad", 1)]}[model]
    stages = [(stage, layer) for stage in ("gather", "gather_bwd") for layer in (0, 1)] + last
    for s in (host, twins):
        with HostOps(s._buffers()) as ops:
            for stage, layer in stages:
                s.run_graph(stage, 1, layer, 1)
            contributions = s.contributions("bwd", 0, 0)
        if s is twins:
            assert not ops.bad, sorted(set(ops.bad))
        else:
            assert ops.bad  # the host-only path computes on the buffers: the check can fail
        s.result = [b.copy() for b in s._buffers()], contributions
    for got, want in zip(twins.result[0], host.result[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for p, (pos, rows) in host.result[1].items():
        np.testing.assert_array_equal(twins.result[1][p][0], pos)
        np.testing.assert_allclose(twins.result[1][p][1], rows, rtol=1e-5, atol=1e-6)

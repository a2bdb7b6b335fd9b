"""Every tensor a task makes is on the device its inputs are on (issue 33: the `gpu` backend's path is the
`cpu` backend's code on another device). On the ``meta`` device ops run on shapes alone, so a CPU-only
machine can run every model's tasks there and see where each op put its output: a tensor created without
``device=`` lands on the CPU and fails this test, and so would a dropout mask drawn on the host (off the
CPU it is drawn on the device: ``kernels/philox.py``). Not covered: the tasks that return numbers (loss,
fused, eval) and GAT's edge tasks (below)."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dorylus_py.kernels.tasks import TaskContext, run_task
from dorylus_py.models.architectures import architecture
from dorylus_py.models.spec import model_spec
from dorylus_py.partition import PartitionStore, prepare
from dorylus_py.pipeline.events import TaskKey
from dorylus_py.pipeline.stages import task_kinds
from graph_servers.graph_state import GraphState
from graph_servers.task_io import task_rows

NUMBERS = {"loss", "fused", "eval"}  # they return Python numbers, which meta tensors do not hold
VALUES = {"edge_fwd", "edge_bwd"}  # GAT's edge tasks size their index arithmetic by values (row pointers):
# shapes alone do not run them, so they are not checked here


class Devices(TorchDispatchMode):
    """Each op's name by the device types of its outputs."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set[str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.seen.setdefault(t.device.type, set()).add(str(func))
        return out


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_every_task_of_every_model_computes_on_its_inputs_device(model, small_graph, tmp_path):
    prepare(small_graph, tmp_path / "p", 1)
    spec = model_spec(model, [small_graph.num_features, 8, small_graph.num_classes], heads=2)
    state = GraphState(PartitionStore.open(tmp_path / "p").load(0), spec, [2], "none", sync=True)
    kernels, meta = architecture(model).kernels(), torch.device("meta")
    kinds = sorted(task_kinds(spec.stages()) - NUMBERS - VALUES)
    assert kinds == ["bwd", "fwd"]
    for kind in kinds:
        for layer in range(spec.num_layers):
            rows = {k: torch.from_numpy(np.ascontiguousarray(v)).to(meta)
                    for k, v in task_rows(state, TaskKey(kind, True, 1, layer, 1)).items()}
            weights = {t.base: torch.empty(t.shape, device=meta) for t in spec.layer_tensors(layer)}
            ctx = TaskContext(model=kernels, kind=kind, layer=layer, epoch=1, seed=0, rate=0.5, attn_rate=0.5,
                              num_train=10)
            with Devices() as ops:
                out, _ = run_task(ctx, rows, weights)
            assert out and all(t.device == meta for t in out.values()), (kind, layer)
            assert "cpu" not in ops.seen, (kind, layer, ops.seen["cpu"])

"""GCN's fused last layer against the unfused path it replaces: the same loss, weight gradient and
input gradient, through the same keyed dropout mask, from the tasks' own entry point (run_task)."""

import pytest
import torch

from dorylus_py.kernels.dropout import dropout_keep_mask
from dorylus_py.kernels.gcn_ops import activation_backward, apply_vertex_input
from dorylus_py.kernels.tasks import TaskContext, TaskError, run_task
from dorylus_py.models import architecture


def context(kind, rate, **kw):
    return TaskContext(model=architecture("gcn").kernels(), kind=kind, layer=1, epoch=3, seed=7, rate=rate, id_start=40,
                       num_train=25, **kw)


@pytest.mark.parametrize("rate", [0.0, 0.5])
def test_fused_task_equals_forward_loss_and_backward(rate):
    """Unfused: Z = P̃ W (fwd), logits = Â Z, loss (loss task), dZ = Âᵀ dlogits, bwd. Fused: the graph
    server's P̃ and Â P̃, one task, then dP̃ = Âᵀ dAP and the activation's backward on the server."""
    torch.manual_seed(0)
    rows, hidden, classes = 60, 8, 4
    g = torch.randn(rows, hidden)  # G_{L-2}: the previous layer's Gather output
    adj = (torch.rand(rows, rows) < 0.1).float() * torch.rand(rows, rows)  # a sparse-ish Â (dense here)
    adj += torch.eye(rows)
    w = torch.randn(hidden, classes)
    labels, train = torch.randint(0, classes, (rows,)), torch.rand(rows) < 0.5

    z, _ = run_task(context("fwd", rate), {"P": g}, {"W": w})
    loss, loss_fields = run_task(context("loss", rate), {"logits": adj @ z["Z"], "labels": labels, "train": train}, {})
    bwd, _ = run_task(context("bwd", rate), {"P": g, "dZ": adj.t() @ loss["dG"]}, {"W": w})

    keep = dropout_keep_mask(40, 40 + rows, hidden, rate, 7, 3, 1) if rate else None
    p_dropped = apply_vertex_input(g, 1, keep, rate)  # the graph server's activate
    out, fused_fields = run_task(context("fused", 0.0), {"AP": adj @ p_dropped, "labels": labels, "train": train}, {"W": w})
    dg = activation_backward(adj.t() @ out["dG"], p_dropped, rate)  # gather_bwd, then activate_bwd

    assert set(out) == {"grad:W1", "dG"} and out["dG"].shape == (rows, hidden)
    assert fused_fields["loss_sum"] == pytest.approx(loss_fields["loss_sum"], rel=1e-6)
    torch.testing.assert_close(out["grad:W1"], bwd["grad:W1"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(dg, bwd["dG"], rtol=1e-6, atol=1e-6)
    assert dg.abs().sum() > 0 and (rate == 0 or (dg[~keep] == 0).all())  # the mask did its part


def test_fused_task_is_gcns_alone():
    with pytest.raises(TaskError, match="GCN's"):
        run_task(TaskContext(model=architecture("sage").kernels(), kind="fused", layer=1, epoch=1, seed=0, rate=0.0),
                 {"AP": torch.zeros(2, 3), "labels": torch.zeros(2, dtype=torch.long), "train": torch.ones(2, dtype=torch.bool)},
                 {"W": torch.zeros(3, 2)})

"""Each model's reference form against PyG's layer of the same name, with the same weights, and the
model descriptions the runtime reads."""

import numpy as np
import pytest
import torch

from dorylus_py.models import build_module, model_spec

pyg = pytest.importorskip("torch_geometric.nn")


def edge_index(graph):
    src, dst = graph.edges()
    return torch.from_numpy(np.stack([src, dst]))


def test_gat_equals_pyg_gatconv(small_graph):
    spec = model_spec("gat", [16, 8, 4], heads=4, out_heads=2, negative_slope=0.2)
    model = build_module(spec, 0.0, 0.0, seed=0)
    p = model.tensors()
    convs = [pyg.GATConv(16, 8, heads=4), pyg.GATConv(32, 4, heads=2, concat=False)]
    with torch.no_grad():
        for l, conv in enumerate(convs):
            conv.lin.weight.copy_(p[f"W{l}"].t())
            conv.att_src.copy_(p[f"att_src{l}"][None])
            conv.att_dst.copy_(p[f"att_dst{l}"][None])
            p[f"b{l}"].copy_(torch.randn(conv.bias.shape))
            conv.bias.copy_(p[f"b{l}"])
    x, ei = torch.from_numpy(small_graph.features), edge_index(small_graph)
    ours = model(model.graph_input(small_graph), x)
    theirs = convs[1](torch.nn.functional.elu(convs[0](x, ei)), ei)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_sage_equals_pyg_sageconv(small_graph):
    spec = model_spec("sage", [16, 32, 4])
    model = build_module(spec, 0.0, 0.0, seed=0)
    p = model.tensors()
    convs = [pyg.SAGEConv(16, 32), pyg.SAGEConv(32, 4)]
    with torch.no_grad():
        for l, conv in enumerate(convs):
            conv.lin_l.weight.copy_(p[f"W_neigh{l}"].t())
            conv.lin_r.weight.copy_(p[f"W_self{l}"].t())
            p[f"b{l}"].copy_(torch.randn(conv.lin_l.bias.shape))
            conv.lin_l.bias.copy_(p[f"b{l}"])
    x, ei = torch.from_numpy(small_graph.features), edge_index(small_graph)
    ours = model(model.graph_input(small_graph), x)
    theirs = convs[1](torch.relu(convs[0](x, ei)), ei)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_model_descriptions():
    gat = model_spec("gat", [1433, 8, 8, 7], heads=8, out_heads=1)
    assert [(s.d_in, s.z_width, s.out_width) for s in gat.layers] == [(1433, 64, 64), (64, 64, 64), (64, 7, 7)]
    assert [(t.name, t.shape) for t in gat.layer_tensors(2)] == [
        ("W2", (64, 7)), ("att_src2", (1, 7)), ("att_dst2", (1, 7)), ("b2", (7,))]
    assert {t.name for t in gat.tensors() if not t.decay} == {"b0", "b1", "b2"}
    assert {s.task for s in gat.stages()} - {None} == {"fwd", "edge_fwd", "loss", "edge_bwd", "bwd", "eval"}
    gcn = model_spec("gcn", [10, 16, 3])
    assert [t.name for t in gcn.tensors() if t.decay] == ["W0"] and not gcn.self_term
    sage = model_spec("sage", [10, 16, 3])
    assert sage.aggregation == "mean" and {s.task for s in sage.stages()} == {s.task for s in gcn.stages()}
    initial = build_module(gat, 0.6, 0.6, seed=5).tensors()
    again = build_module(gat, 0.0, 0.0, seed=5).tensors()
    assert all(torch.equal(initial[k], again[k]) for k in initial)  # the seed alone fixes the initial weights

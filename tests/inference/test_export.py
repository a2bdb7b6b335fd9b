"""`dorylus export`: a PyG stack built from the export, as docs/usage.md shows, gives the logits `predict`
gives (GCN, GAT, GraphSAGE); the torch export rebuilds the reference module; both load with weights_only."""

import numpy as np
import pytest
import torch

from dorylus_py.api import predict
from dorylus_py.cli import main
from dorylus_py.data.graph import row_normalized
from dorylus_py.inference.export import torch_module


def pyg_model(path):
    """The lines of docs/usage.md: the convs, their weights, and the forward between them."""
    pyg_nn = pytest.importorskip("torch_geometric.nn", reason="torch_geometric is the bench extra")
    saved = torch.load(path, weights_only=True)
    convs = torch.nn.ModuleList(getattr(pyg_nn, c["class"])(**c["kwargs"]) for c in saved["convs"])
    convs.load_state_dict(saved["state_dict"])
    activation = getattr(torch.nn.functional, saved["activation"])

    def forward(x, edge_index):
        for i, conv in enumerate(convs):
            x = conv(activation(x) if i else x, edge_index)
        return x

    return saved, forward


@pytest.mark.parametrize("model", ["gcn", "gat", "sage"])
@pytest.mark.parametrize("weights", ["best", "final"])
def test_a_pyg_model_from_the_export_gives_the_logits_of_predict(small_runs, model, weights, tmp_path, capsys):
    _, runs = small_runs
    out = tmp_path / "model.pt"
    assert main(["export", str(runs[model]), str(out), "--to", "pyg", "--weights", weights]) == 0
    assert "wrote" in capsys.readouterr().out
    saved, forward = pyg_model(out)
    result = predict(runs[model], weights=weights)
    graph = result.graph
    x = row_normalized(graph.features) if saved["feature_norm"] == "row" else graph.features
    src, dst = graph.edges()
    with torch.no_grad():
        logits = forward(torch.from_numpy(x), torch.from_numpy(np.stack([src, dst]))).numpy()
    assert saved["model"] == model and logits.shape == result.logits.shape
    np.testing.assert_allclose(logits, result.logits, atol=1e-5, rtol=1e-5)


def test_the_pyg_export_is_of_the_chosen_weights(small_runs, tmp_path):
    _, runs = small_runs
    for weights in ("best", "final"):
        assert main(["export", str(runs["sage"]), str(tmp_path / f"{weights}.pt"), "--to", "pyg", "--weights",
                     weights]) == 0
    best, final = (torch.load(tmp_path / f"{w}.pt", weights_only=True)["state_dict"] for w in ("best", "final"))
    with np.load(runs["sage"] / "best_weights.npz") as z:
        np.testing.assert_array_equal(best["0.lin_r.weight"].numpy(), z["W_self0"].T)
    assert any(not torch.equal(best[k], final[k]) for k in best)


@pytest.mark.parametrize("model", ["gcn", "gat", "sage"])
def test_the_torch_export_rebuilds_the_reference_module(small_runs, model, tmp_path):
    _, runs = small_runs
    out = tmp_path / "model.pt"
    assert main(["export", str(runs[model]), str(out), "--to", "torch"]) == 0
    module = torch_module(out)  # torch.load(weights_only=True): plain tensors, strings and numbers
    result = predict(runs[model])
    x = row_normalized(result.graph.features) if torch.load(out)["feature_norm"] == "row" else result.graph.features
    with torch.no_grad():
        logits = module(module.graph_input(result.graph), torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(logits, result.logits)


def test_bad_export_arguments_get_one_line(small_runs, tmp_path, capsys):
    _, runs = small_runs
    (tmp_path / "there.pt").write_bytes(b"keep")
    for args, message in ((["--to", "onnx", str(tmp_path / "m.pt")], "invalid choice: 'onnx'"),
                          (["--to", "pyg", str(tmp_path / "there.pt")], "already exists"),
                          (["--to", "pyg", str(tmp_path / "no" / "m.pt")], "output folder does not exist")):
        assert main(["export", str(runs["gcn"]), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert (tmp_path / "there.pt").read_bytes() == b"keep"
    assert main(["export", str(tmp_path), str(tmp_path / "m.pt"), "--to", "torch"]) == 2
    assert "config.json: missing" in capsys.readouterr().err and not (tmp_path / "m.pt").exists()

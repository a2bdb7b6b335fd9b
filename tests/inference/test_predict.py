"""`dorylus predict`: a trained model's outputs for every vertex, scoring exactly what the run recorded at the
chosen weights; embeddings that are the last layer's input; a dataset the model does not fit refused."""

import json

import numpy as np
import pytest

from dorylus_py.api import predict
from dorylus_py.cli import main
from dorylus_py.data import SynthConfig, generate, write_npz
from dorylus_py.errors import DataError
from dorylus_py.kernels.sparse import gcn_norm_weights
from tests.conftest import DATASETS
from tests.inference.conftest import train




@pytest.fixture(scope="module")
def cora_run(tmp_path_factory):
    path = DATASETS / "cora.npz"
    run = tmp_path_factory.mktemp("cora") / "run"
    # a high learning rate overshoots: the best validation epoch comes before the last
    return run, train(path, run, "--epochs", "12", "--lr", "0.2")


@pytest.mark.parametrize("weights,recorded", [("best", "test_acc_at_best_val"), ("final", "final_test_acc")])
def test_predictions_of_a_cora_run_score_its_recorded_test_accuracy(cora_run, weights, recorded, tmp_path, capsys):
    run, summary = cora_run
    out = tmp_path / "pred.npz"
    assert main(["predict", str(run), "--weights", weights, "--out", str(out)]) == 0
    assert f"test accuracy {summary[recorded]:.4f}" in capsys.readouterr().out
    with np.load(out) as z:
        ids, probabilities = z["ids"], z["probabilities"]
    graph = predict(run, weights=weights).graph
    assert np.array_equal(ids, np.arange(graph.num_nodes)) and probabilities.shape == (graph.num_nodes, 7)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    right = probabilities.argmax(axis=1)[graph.test_mask] == graph.labels[graph.test_mask]
    assert np.float32(right.sum()) / np.float32(right.size) == np.float32(summary[recorded])  # exactly


def test_best_and_final_weights_differ_when_the_best_epoch_is_not_the_last(cora_run):
    run, summary = cora_run
    assert summary["best_epoch"] < summary["epochs"]  # the run the test above checks has two distinct points
    assert not np.array_equal(predict(run, weights="best").logits, predict(run, weights="final").logits)


@pytest.mark.parametrize("model", ["gcn", "gat", "sage"])
def test_every_model_predicts_its_recorded_accuracy_and_writes_npy(small_runs, model, tmp_path):
    data, runs = small_runs
    summary = json.loads((runs[model] / "summary.json").read_text())
    result = predict(runs[model], embeddings=True)
    assert result.accuracy("test") == summary["test_acc_at_best_val"]
    hidden = 2 * 8 if model == "gat" else 8
    assert result.embeddings.shape == (300, hidden) and result.embeddings.dtype == np.float32
    assert main(["predict", str(runs[model]), "--out", str(tmp_path / "p.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), result.probabilities)
    assert main(["predict", str(runs[model]), "--embeddings", "--out", str(tmp_path / "e.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "e.npy"), result.embeddings)


def test_gcn_embeddings_are_the_last_layers_input(small_runs):
    """logits = Â (embeddings W1): the embeddings are the activated last hidden layer."""
    _, runs = small_runs
    result = predict(runs["gcn"], embeddings=True)
    graph = result.graph
    assert (result.embeddings >= 0).all() and (result.embeddings > 0).any()  # after the ReLU
    with np.load(runs["gcn"] / "best_weights.npz") as z:
        w1 = z["W1"]
    indptr, indices, values = gcn_norm_weights(graph.indptr, graph.indices)
    zw = result.embeddings.astype(np.float64) @ w1
    rows = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    logits = np.zeros((graph.num_nodes, w1.shape[1]))
    np.add.at(logits, rows, values[:, None] * zw[indices])
    np.testing.assert_allclose(result.logits, logits, atol=1e-5)


def test_another_dataset_of_the_same_widths_is_predicted(small_runs, tmp_path):
    _, runs = small_runs
    other = tmp_path / "other.npz"
    write_npz(generate(SynthConfig(nodes=200, edges=1_000, features=12, classes=3, seed=9)), other)
    assert main(["predict", str(runs["sage"]), "--data", str(other), "--out", str(tmp_path / "p.npz")]) == 0
    with np.load(tmp_path / "p.npz") as z:
        assert z["probabilities"].shape == (200, 3) and "embeddings" not in z.files


@pytest.mark.parametrize("features,classes,problem", [
    (13, 3, "13 features per vertex, but the model in .* takes 12"),
    (12, 4, "4 classes, but the model in .* predicts 3"),
])
def test_a_dataset_the_model_does_not_fit_gets_one_line(small_runs, tmp_path, capsys, features, classes, problem):
    _, runs = small_runs
    other = tmp_path / "other.npz"
    write_npz(generate(SynthConfig(nodes=200, edges=1_000, features=features, classes=classes, seed=9)), other)
    out = tmp_path / "p.npy"
    assert main(["predict", str(runs["gcn"]), "--data", str(other), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and not out.exists()
    with pytest.raises(DataError, match=problem):
        predict(runs["gcn"], other)


@pytest.mark.parametrize("args,message", [
    (["--out", "{tmp}/p.csv"], "write .npy (an array) or .npz"),
    (["--out", "{tmp}/none/p.npy"], "output folder does not exist"),
    (["--out", "{tmp}/p.npy", "--weights", "last"], "invalid choice: 'last'"),
    (["--out", "{tmp}/p.npy", "--data", "{tmp}/missing.npz"], "missing.npz: no such file or folder"),
])
def test_bad_arguments_get_one_line(small_runs, tmp_path, capsys, args, message):
    _, runs = small_runs
    assert main(["predict", str(runs["gcn"]), *[a.format(tmp=tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_broken_run_record_gets_one_line(small_runs, tmp_path, capsys):
    _, runs = small_runs
    assert main(["predict", str(tmp_path), "--out", str(tmp_path / "p.npy")]) == 2
    assert "config.json: missing: not a run record" in capsys.readouterr().err
    broken = tmp_path / "run"
    broken.mkdir()
    (broken / "config.json").write_text((runs["gcn"] / "config.json").read_text())
    with np.load(runs["gcn"] / "best_weights.npz") as z:
        np.savez(broken / "best_weights.npz", W0=z["W0"])
    assert main(["predict", str(broken), "--data", str(small_runs[0]), "--out", str(tmp_path / "p.npy")]) == 2
    assert "best_weights.npz: no tensor W1" in capsys.readouterr().err
    assert main(["predict", str(broken), "--weights", "final", "--out", str(tmp_path / "p.npy")]) == 2
    assert "weights.npz: missing" in capsys.readouterr().err and not (tmp_path / "p.npy").exists()


def test_a_changed_dataset_file_is_refused(small_runs, tmp_path, capsys):
    data, runs = small_runs
    run = tmp_path / "run"
    copy = tmp_path / "g.npz"
    copy.write_bytes(data.read_bytes())
    train(copy, run, "--epochs", "2")
    write_npz(generate(SynthConfig(nodes=301, edges=3_000, features=12, classes=3, seed=5)), copy)
    capsys.readouterr()
    assert main(["predict", str(run), "--out", str(tmp_path / "p.npy")]) == 2
    err = capsys.readouterr().err
    assert "g.npz: not the dataset the run in" in err and "pass --data PATH" in err and err.count("\n") == 1


def test_a_distributed_run_on_a_prepared_folder_is_predicted_in_vertex_order(small_runs, tmp_path):
    """The store's partitions are put back together in the dataset's vertex order: the weights of a K=2 run
    score the test accuracy the graph servers counted."""
    data, _ = small_runs
    store = tmp_path / "store"
    assert main(["prepare", str(data), "--partitions", "2", "--partitioner", "metis", "--out", str(store)]) == 0
    summary = train(store, tmp_path / "run", "--backend", "cpu", "--epochs", "3", "--hidden", "8")
    result = predict(tmp_path / "run")
    assert result.accuracy("test") == pytest.approx(summary["test_acc_at_best_val"], abs=1e-6)
    from_file = predict(tmp_path / "run", data)  # the same graph, from the file the store was made of
    np.testing.assert_allclose(from_file.logits, result.logits, atol=1e-6)

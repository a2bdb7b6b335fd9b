"""`dorylus predict --backend local|cpu`: the forward pass through graph servers (K=2, the evaluation stages
of the training pipeline alone) equals the single-process one to 1e-5, embeddings included."""

import numpy as np
import pytest

from dorylus_py.api import predict
from dorylus_py.cli import main
from dorylus_py.errors import ConfigError, DorylusError
from dorylus_py.inference.distributed import assemble


@pytest.fixture(scope="module")
def store(small_runs, tmp_path_factory):
    data, _ = small_runs
    out = tmp_path_factory.mktemp("store") / "store"
    assert main(["prepare", str(data), "--partitions", "2", "--partitioner", "metis", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("model", ["gcn", "gat", "sage"])
@pytest.mark.long
def test_local_k2_equals_one_process(small_runs, store, model, tmp_path):
    _, runs = small_runs
    out = tmp_path / "p.npz"
    assert main(["predict", str(runs[model]), "--data", str(store), "--backend", "local", "--embeddings",
                 "--out", str(out)]) == 0
    one = predict(runs[model], store, embeddings=True)
    with np.load(out) as z:
        np.testing.assert_allclose(z["probabilities"], one.probabilities, atol=1e-5)
        np.testing.assert_allclose(z["embeddings"], one.embeddings, atol=1e-5)
        assert np.array_equal(z["ids"], np.arange(300))


def test_cpu_backend_gives_the_logits_too(small_runs, store):
    _, runs = small_runs
    many = predict(runs["sage"], store, weights="final", backend="cpu")
    np.testing.assert_allclose(many.logits, predict(runs["sage"], store, weights="final").logits, atol=1e-5)
    assert many.embeddings is None


def test_the_backend_needs_a_prepared_store(small_runs, tmp_path, capsys):
    data, runs = small_runs
    with pytest.raises(ConfigError, match='^backend="local": .* pass data=DIR, a folder made by `dorylus prepare`'):
        predict(runs["gcn"], data, backend="local")
    assert main(["predict", str(runs["gcn"]), "--backend", "local", "--out", str(tmp_path / "p.npy")]) == 2
    assert "error: --backend local: predict runs through graph servers on a prepared store; pass --data DIR" in \
        capsys.readouterr().err


def test_outputs_that_do_not_cover_every_vertex_once_are_refused():
    part = {"ids": np.array([0, 1], np.int64), "logits": np.zeros((2, 3), np.float32)}
    logits, _ = assemble([part, {"ids": np.array([2], np.int64), "logits": np.ones((1, 3), np.float32)}], 3, 3)
    assert logits[2].tolist() == [1, 1, 1]
    for parts in ([part], [part, part], [{"ids": np.array([5], np.int64), "logits": np.zeros((1, 3), np.float32)}],
                  [{"ids": np.array([0, 1, 2], np.int64), "logits": np.zeros((3, 2), np.float32)}]):
        with pytest.raises(DorylusError):
            assemble(parts, 3, 3)

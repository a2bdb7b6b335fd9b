import torch

from dorylus_py.kernels.dropout import dropout, dropout_keep_mask


def test_mask_depends_only_on_vertex_and_keys():
    full = dropout_keep_mask(0, 1000, 33, 0.3, seed=5, epoch=2, layer=1)
    for a, b in [(0, 1), (7, 19), (500, 1000), (999, 1000)]:
        assert torch.equal(dropout_keep_mask(a, b, 33, 0.3, 5, 2, 1), full[a:b])
    assert not torch.equal(dropout_keep_mask(0, 1000, 33, 0.3, 5, 3, 1), full)  # epoch
    assert not torch.equal(dropout_keep_mask(0, 1000, 33, 0.3, 5, 2, 0), full)  # layer
    assert not torch.equal(dropout_keep_mask(0, 1000, 33, 0.3, 6, 2, 1), full)  # seed


def test_rate_and_scaling():
    keep = dropout_keep_mask(0, 4000, 50, 0.3, 0, 0, 0)
    assert abs(keep.float().mean().item() - 0.7) < 0.01
    h = torch.ones(4000, 50)
    out = dropout(h, 0.3, 0, 0, 0)
    assert torch.allclose(out[keep], torch.full_like(out[keep], 1 / 0.7))
    assert (out[~keep] == 0).all()
    assert dropout(h, 0.0, 0, 0, 0) is h

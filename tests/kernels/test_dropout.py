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


def test_applying_a_mask_on_the_cpu_gives_torchs_bits():
    """apply_dropout multiplies by the boolean mask in numpy on the CPU (much faster than torch there):
    the same products in the same order as torch's ``p * keep * scale``, so the same bits."""
    from dorylus_py.kernels.gcn_ops import apply_dropout

    p = torch.randn(300, 40)
    p[0, :4] = torch.tensor([-0.0, float("inf"), -1e-38, 3e38])
    for rate in (0.1, 0.5, 0.6):
        keep = dropout_keep_mask(0, 300, 40, rate, seed=4, epoch=2, layer=0)
        fast, reference = apply_dropout(p, keep, rate), (p * keep).mul_(1.0 / (1.0 - rate))
        assert torch.equal(fast.view(torch.int32), reference.view(torch.int32))
    assert apply_dropout(p, None, 0.5) is p


def test_a_backward_task_reuses_its_forwards_mask_and_the_cache_stays_bounded():
    from dorylus_py.kernels.tasks import _RecentMasks

    cache, drawn = _RecentMasks(limit=3 * 100 * 8), []

    def draw(epoch):
        def f():
            drawn.append(epoch)
            return dropout_keep_mask(0, 100, 8, 0.5, seed=1, epoch=epoch, layer=0)
        return f

    first = cache.get(("k", 1), draw(1))
    assert cache.get(("k", 1), draw(1)) is first and drawn == [1]  # the backward's: not drawn again
    assert torch.equal(first, dropout_keep_mask(0, 100, 8, 0.5, seed=1, epoch=1, layer=0))
    for epoch in (2, 3, 4):
        cache.get(("k", epoch), draw(epoch))
    assert len(cache.masks) == 3 and ("k", 1) not in cache.masks  # the oldest went

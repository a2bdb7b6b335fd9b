import torch

from dorylus_py.kernels.dropout import dropout_keep_mask
from dorylus_py.kernels.gcn_ops import (
    apply_vertex_backward,
    apply_vertex_forward,
    softmax_cross_entropy,
)


def test_apply_vertex_backward_matches_autograd():
    torch.manual_seed(0)
    for layer in (0, 1):
        g = torch.randn(30, 5, dtype=torch.float64, requires_grad=True)
        w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
        keep = dropout_keep_mask(0, 30, 5, 0.4, 1, 2, layer)
        z = apply_vertex_forward(g, w, layer, keep, 0.4)
        dz = torch.randn_like(z)
        (z * dz).sum().backward()
        dw, dg = apply_vertex_backward(g.detach(), w.detach(), dz, layer, keep, 0.4)
        torch.testing.assert_close(dw, w.grad)
        if layer == 0:
            assert dg is None
        else:
            torch.testing.assert_close(dg, g.grad)


def test_cross_entropy_gradient_matches_autograd():
    torch.manual_seed(1)
    logits = torch.randn(20, 4, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 4, (20,))
    train = torch.rand(20) < 0.5
    loss_sum, grad = softmax_cross_entropy(logits.detach(), labels, train, num_train=50)
    ref = torch.nn.functional.cross_entropy(logits[train], labels[train], reduction="sum") / 50
    ref.backward()
    torch.testing.assert_close(loss_sum / 50, ref.detach())
    torch.testing.assert_close(grad, logits.grad)

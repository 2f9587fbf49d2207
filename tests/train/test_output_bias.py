"""The fused label-smoothed loss with an output bias (imported Marian models have one): the same loss
and gradients as the plain computation."""

import torch
import torch.nn.functional as F

from nmt.train.loss import linear_label_smoothed_cross_entropy


def test_fused_loss_with_a_bias_matches_the_plain_computation():
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    bias = torch.randn(50, requires_grad=True)
    target = torch.randint(0, 50, (37,))
    loss, nll = linear_label_smoothed_cross_entropy(
        hidden, weight, target, epsilon=0.1, bias=bias, chunk_rows=8
    )
    loss.backward()
    grads = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    logits = hidden @ weight.T + bias
    expected = F.cross_entropy(logits, target, label_smoothing=0.1, reduction="sum")
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        nll, F.cross_entropy(logits, target, reduction="sum"), rtol=1e-5, atol=1e-4
    )
    for got, t in zip(grads, (hidden, weight, bias)):
        torch.testing.assert_close(got, t.grad, rtol=1e-4, atol=1e-5)

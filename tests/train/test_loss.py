import pytest
import torch
import torch.nn.functional as F

from nmt.train.loss import linear_label_smoothed_cross_entropy


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_rows", [3, 64, 1000])
def test_fused_loss_and_gradients_equal_the_plain_computation(epsilon, chunk_rows):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=generator, dtype=torch.float64).float().requires_grad_()
    weight = torch.randn(50, 16, generator=generator).mul(0.3).requires_grad_()
    target = torch.randint(0, 50, (37,), generator=generator)

    loss, nll = linear_label_smoothed_cross_entropy(
        hidden, weight, target, epsilon=epsilon, chunk_rows=chunk_rows
    )
    (loss * 0.5).backward()
    fused = (hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None

    logits = hidden @ weight.T
    reference = F.cross_entropy(logits, target, label_smoothing=epsilon, reduction="sum")
    (reference * 0.5).backward()
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        nll, F.cross_entropy(logits, target, reduction="sum").detach(), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(fused[0], hidden.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(fused[1], weight.grad, rtol=1e-4, atol=1e-6)


def test_no_gradient_work_without_grad():
    hidden, weight, target = torch.randn(5, 4), torch.randn(7, 4), torch.randint(0, 7, (5,))
    with torch.no_grad():
        loss, nll = linear_label_smoothed_cross_entropy(hidden, weight, target, epsilon=0.1)
    assert loss.item() > nll.item() * 0.5 and not loss.requires_grad

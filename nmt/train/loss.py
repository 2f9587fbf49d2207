"""Label-smoothed cross entropy fused with the output projection, returning sums.

The vocabulary projection and its loss are the costliest part of a small model's step (8k classes
per target token). Done the plain way, the (N, V) logits, their log-softmax, the gather's gradient
and the softmax gradient are each written to memory and read back. Here rows are processed in
chunks that stay in cache: per chunk the logits are computed, exponentiated once in place (the
same exponentials give the loss and the softmax), turned into their gradient in place and
multiplied back into the gradients of the hidden states and of the weight right away, so nothing
of size (N, V) is ever stored. The analytic gradient of label-smoothed cross entropy is
``softmax(z) - (1 - eps) * onehot(target) - eps / V``.

Sums, not means: the trainer normalises once per update by the token count of all ranks.
"""

from __future__ import annotations

import torch

CHUNK_ROWS = 512  # (512, 8k) fp32 logits = 16 MB: 256 rows measured 15% slower (thinner GEMMs)


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        target: torch.Tensor,
        epsilon: float,
        chunk_rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden32, weight32 = hidden.float(), weight.float()
        num_rows, num_classes = hidden.shape[0], weight.shape[0]
        needs_grad = hidden.requires_grad or weight.requires_grad
        loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
        nll = torch.zeros((), dtype=torch.float64, device=hidden.device)
        grad_hidden = torch.empty_like(hidden32) if needs_grad else None  # (N, D)
        grad_weight = torch.zeros_like(weight32) if needs_grad else None  # (V, D)
        # sum over classes of z = h . (sum of the weight's rows): a matrix-vector product instead
        # of one more pass over the (C, V) logits.
        weight_sum = weight32.sum(dim=0)  # (D,)
        for start in range(0, num_rows, chunk_rows):
            rows = slice(start, min(start + chunk_rows, num_rows))
            h, t = hidden32[rows], target[rows]  # (C, D), (C,)
            logits = h @ weight32.T  # (C, V)
            target_logit = logits.gather(-1, t.unsqueeze(-1)).squeeze(-1)  # (C,)
            row_max = logits.amax(dim=-1, keepdim=True)  # (C, 1)
            # One exp per logit: the same exponentials give the log-sum-exp and the softmax.
            exp_sum = logits.sub_(row_max).exp_().sum(dim=-1, keepdim=True)  # (C, 1)
            lse = (row_max + exp_sum.log()).squeeze(-1)  # (C,)
            chunk_nll = (lse - target_logit).sum()
            # sum over classes of -log p = V * lse - sum(z)
            chunk_smooth = lse.sum() * num_classes - (h @ weight_sum).sum()
            loss += (1.0 - epsilon) * chunk_nll + (epsilon / num_classes) * chunk_smooth
            nll += chunk_nll
            if needs_grad:
                grad_logits = logits.div_(exp_sum)  # softmax, in place
                if epsilon:
                    grad_logits.sub_(epsilon / num_classes)
                grad_logits[torch.arange(t.shape[0], device=t.device), t] -= 1.0 - epsilon
                torch.mm(grad_logits, weight32, out=grad_hidden[rows])
                grad_weight.addmm_(grad_logits.T, h)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return loss.float(), nll.float()

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, grad_loss: torch.Tensor, grad_nll: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (
            (grad_hidden * grad_loss).to(hidden_dtype),
            (grad_weight * grad_loss).to(weight_dtype),
            None,
            None,
            None,
        )


def linear_label_smoothed_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    *,
    epsilon: float,
    bias: torch.Tensor | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sum, nll sum) of ``hidden @ weight.T (+ bias)`` against ``target``, computed in fp32.

    hidden: (N, D) real target positions only; weight: (V, D) the output projection; bias: (V,) its
    bias, if it has one; target: (N,). Smoothing spreads ``epsilon`` uniformly over all V classes,
    the gold one included (as ``F.cross_entropy(label_smoothing=...)``). The nll is a detached metric.
    """
    if bias is not None:  # a column of ones against the bias: autograd carries its gradient
        hidden = torch.cat([hidden, hidden.new_ones(hidden.shape[0], 1)], dim=1)  # (N, D + 1)
        weight = torch.cat([weight, bias[:, None].to(weight.dtype)], dim=1)  # (V, D + 1)
    loss, nll = _LinearLabelSmoothedCrossEntropy.apply(hidden, weight, target, epsilon, chunk_rows)
    return loss, nll.detach()

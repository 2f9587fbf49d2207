"""Label-smoothed cross entropy returning sums, so normalisation happens once per update."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_smoothed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, *, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss sum, nll sum) over the given positions (the caller passes real tokens only).

    logits: (N, V); target: (N,). Smoothing spreads ``epsilon`` uniformly over the vocabulary
    (the gold class included), as ``F.cross_entropy(label_smoothing=...)`` does. Computed in fp32.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (N,)
    nll_sum = nll.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach()
    smooth_sum = -lprobs.sum()
    loss_sum = (1.0 - epsilon) * nll_sum + (epsilon / lprobs.shape[-1]) * smooth_sum
    return loss_sum, nll_sum.detach()

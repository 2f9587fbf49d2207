"""Training: loss, LR schedules, checkpoints, the loop."""

from nmt.train.lr import VariableBatchSizeLR

__all__ = ["VariableBatchSizeLR"]

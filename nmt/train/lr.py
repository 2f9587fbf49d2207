"""Learning-rate schedules and batch-size scaling of the learning rate.

Schedules are pure functions of the update number (testable without an optimizer) wrapped into
``torch.optim.lr_scheduler.LambdaLR``. ``VariableBatchSizeLR`` wraps *any* torch scheduler and
multiplies its learning rate by a function of the current update's batch size, restoring the base
value before each base step so that chained schedulers are not distorted by the scaling.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch


def warmup_factor(step: int, *, warmup_updates: int, warmup_init_ratio: float) -> float | None:
    """Linear warm-up from ``warmup_init_ratio`` to 1 over ``warmup_updates``; None once it is over."""
    if warmup_updates > 0 and step < warmup_updates:
        return warmup_init_ratio + (1.0 - warmup_init_ratio) * step / warmup_updates
    return None


def inverse_sqrt_factor(step: int, *, warmup_updates: int, warmup_init_ratio: float) -> float:
    """Warm-up, then decay with 1/sqrt(step)."""
    warming = warmup_factor(
        step, warmup_updates=warmup_updates, warmup_init_ratio=warmup_init_ratio
    )
    return warming if warming is not None else math.sqrt(max(warmup_updates, 1) / max(step, 1))


def fixed_factor(step: int, *, warmup_updates: int, warmup_init_ratio: float) -> float:
    warming = warmup_factor(
        step, warmup_updates=warmup_updates, warmup_init_ratio=warmup_init_ratio
    )
    return warming if warming is not None else 1.0


def cosine_factor(
    step: int,
    *,
    warmup_updates: int,
    warmup_init_ratio: float,
    max_update: int,
    min_ratio: float,
    time_progress: float = 0.0,
) -> float:
    """Warm-up, then half a cosine down to ``min_ratio`` over the run's progress: the larger of
    the share of ``max_update`` done (0: no update limit) and ``time_progress``, the share of the
    time budget spent, so the learning rate reaches its floor at whichever limit stops the run."""
    warming = warmup_factor(
        step, warmup_updates=warmup_updates, warmup_init_ratio=warmup_init_ratio
    )
    if warming is not None:
        return warming
    by_updates = (
        (step - warmup_updates) / max(1, max_update - warmup_updates) if max_update else 0.0
    )
    progress = min(1.0, max(by_updates, time_progress))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class CosineSchedule:
    """``cosine_factor`` as a callable object whose ``time_progress`` the run can move on
    (``VariableBatchSizeLR.follow_time``: at each log point, and on resume from the checkpoint's
    clock); LambdaLR saves it with the scheduler's state."""

    def __init__(
        self, *, warmup_updates: int, warmup_init_ratio: float, max_update: int, min_ratio: float
    ) -> None:
        self.warmup_updates = warmup_updates
        self.warmup_init_ratio = warmup_init_ratio
        self.max_update = max_update
        self.min_ratio = min_ratio
        self.time_progress = 0.0

    def __call__(self, step: int) -> float:
        return cosine_factor(
            step,
            warmup_updates=self.warmup_updates,
            warmup_init_ratio=self.warmup_init_ratio,
            max_update=self.max_update,
            min_ratio=self.min_ratio,
            time_progress=self.time_progress,
        )


def schedule_factor(
    name: str,
    *,
    lr: float,
    warmup_updates: int,
    warmup_init_lr: float,
    max_update: int = 0,
    min_lr: float = 0.0,
) -> Callable[[int], float]:
    """The multiplier of ``lr`` at each update, for LambdaLR."""
    warmup_init_ratio = min(1.0, warmup_init_lr / lr)
    if name == "inverse_sqrt":
        return lambda step: inverse_sqrt_factor(
            step, warmup_updates=warmup_updates, warmup_init_ratio=warmup_init_ratio
        )
    if name == "fixed":
        return lambda step: fixed_factor(
            step, warmup_updates=warmup_updates, warmup_init_ratio=warmup_init_ratio
        )
    if name == "cosine":
        return CosineSchedule(
            warmup_updates=warmup_updates,
            warmup_init_ratio=warmup_init_ratio,
            max_update=max_update,
            min_ratio=min_lr / lr,
        )
    raise ValueError(f"--lr-scheduler: unknown schedule {name!r}")


def batch_size_scale(batch_size: float, *, reference: float, rule: str) -> float:
    """The factor for ``rule`` (none | linear | sqrt) at this batch size relative to ``reference``."""
    if rule == "none":
        return 1.0
    if reference <= 0:
        raise ValueError(f"--lr-scaling-reference must be positive, got {reference}")
    ratio = batch_size / reference
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    raise ValueError(f"--lr-scaling: unknown rule {rule!r}")


class VariableBatchSizeLR:
    """Scale a base scheduler's learning rate by the size of each update's batch.

    Call ``step(batch_size)`` once per update *before* ``optimizer.step()``: it advances the base
    scheduler to this update and sets each group's lr to ``base_lr * scale(batch_size)``.
    With ``reference=0`` the first update's batch size becomes the reference (saved in the state).
    """

    def __init__(
        self, base: torch.optim.lr_scheduler.LRScheduler, *, rule: str, reference: float = 0.0
    ) -> None:
        batch_size_scale(1.0, reference=1.0, rule=rule)  # validates the rule name
        self.base = base
        self.optimizer = base.optimizer
        self.rule = rule
        self.reference = reference
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.last_scale = 1.0

    def step(self, batch_size: float) -> list[float]:
        if self.rule != "none" and self.reference <= 0:
            self.reference = float(batch_size)
        # The base scheduler reads the group lr (chainable schedulers multiply it): give it back
        # its own value, step it, and remember the result before scaling.
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr
        with warnings.catch_warnings():
            # Stepping before optimizer.step() is deliberate: the lr must be set for *this* update.
            warnings.filterwarnings(
                "ignore", message=r"Detected call of `lr_scheduler.step\(\)` before"
            )
            self.base.step()
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.last_scale = batch_size_scale(batch_size, reference=self.reference, rule=self.rule)
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * self.last_scale
        return self.get_last_lr()

    def follow_time(self, progress: float) -> None:
        """Give a time-driven schedule (cosine under --stop-time-hours) the share of the time
        budget spent; the next ``step`` uses it. Every rank must pass the same value."""
        for schedule in self.base.lr_lambdas:
            if isinstance(schedule, CosineSchedule):
                schedule.time_progress = progress

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def fast_forward(self, num_updates: int) -> None:
        """Move the base schedule on to update ``num_updates`` (a fresh schedule in a resumed run),
        as if it had been stepped that often at the reference batch size."""
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=r"Detected call of `lr_scheduler.step\(\)` before"
            )
            for _ in range(num_updates):
                self.base.step()
        self.base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * self.last_scale

    def state_dict(self) -> dict[str, Any]:
        return {
            "base": self.base.state_dict(),
            "reference": self.reference,
            "base_lrs": list(self.base_lrs),
            "last_scale": self.last_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state["base"])
        self.reference = state["reference"]
        self.base_lrs = list(state["base_lrs"])
        self.last_scale = state["last_scale"]
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base_lr * self.last_scale


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    name: str,
    lr: float,
    warmup_updates: int,
    warmup_init_lr: float,
    max_update: int,
    min_lr: float,
    scaling: str,
    scaling_reference: float,
) -> VariableBatchSizeLR:
    """The trainer's scheduler: a LambdaLR schedule inside the batch-size wrapper (rule none = identity).

    LambdaLR evaluates factor(0) at construction; the first ``step`` moves to update 1.
    """
    factor = schedule_factor(
        name,
        lr=lr,
        warmup_updates=warmup_updates,
        warmup_init_lr=warmup_init_lr,
        max_update=max_update,
        min_lr=min_lr,
    )
    base = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return VariableBatchSizeLR(base, rule=scaling, reference=scaling_reference)

import math

import pytest
import torch

from nmt.train import VariableBatchSizeLR
from nmt.train.lr import batch_size_scale, build_scheduler, inverse_sqrt_factor


def optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def test_inverse_sqrt_warms_up_linearly_then_decays():
    assert inverse_sqrt_factor(0, warmup_updates=100, warmup_init_ratio=0.0) == 0.0
    assert inverse_sqrt_factor(50, warmup_updates=100, warmup_init_ratio=0.0) == pytest.approx(0.5)
    assert inverse_sqrt_factor(100, warmup_updates=100, warmup_init_ratio=0.0) == pytest.approx(1.0)
    assert inverse_sqrt_factor(400, warmup_updates=100, warmup_init_ratio=0.0) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "rule, expected", [("linear", lambda r: r), ("sqrt", math.sqrt), ("none", lambda r: 1.0)]
)
def test_scaling_rules(rule, expected):
    opt = optimizer()
    sched = build_scheduler(
        opt,
        name="fixed",
        lr=1.0,
        warmup_updates=0,
        warmup_init_lr=0.0,
        max_update=0,
        min_lr=0.0,
        scaling=rule,
        scaling_reference=1000,
    )
    for batch in (500, 1000, 4000, 250):
        lr = sched.step(batch)[0]
        assert lr == pytest.approx(expected(batch / 1000))
        assert opt.param_groups[0]["lr"] == pytest.approx(lr)


def test_scaling_does_not_distort_a_chainable_base_schedule():
    """ExponentialLR multiplies the group's current lr: the wrapper must hand it back unscaled."""
    plain_opt, wrapped_opt = optimizer(), optimizer()
    plain = torch.optim.lr_scheduler.ExponentialLR(plain_opt, gamma=0.9)
    wrapped = VariableBatchSizeLR(
        torch.optim.lr_scheduler.ExponentialLR(wrapped_opt, gamma=0.9), rule="linear", reference=100
    )
    for batch in (100, 400, 50, 300, 100):
        plain_opt.step()
        plain.step()
        assert wrapped.step(batch)[0] == pytest.approx(plain.get_last_lr()[0] * batch / 100)


def test_reference_defaults_to_the_first_batch_and_survives_a_state_round_trip():
    opt = optimizer(lr=2.0)
    sched = build_scheduler(
        opt,
        name="fixed",
        lr=2.0,
        warmup_updates=0,
        warmup_init_lr=0.0,
        max_update=0,
        min_lr=0.0,
        scaling="sqrt",
        scaling_reference=0,
    )
    assert sched.step(300)[0] == pytest.approx(2.0)
    assert sched.step(1200)[0] == pytest.approx(4.0)
    state = sched.state_dict()
    opt2 = optimizer(lr=2.0)
    restored = build_scheduler(
        opt2,
        name="fixed",
        lr=2.0,
        warmup_updates=0,
        warmup_init_lr=0.0,
        max_update=0,
        min_lr=0.0,
        scaling="sqrt",
        scaling_reference=0,
    )
    restored.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(4.0)
    assert restored.step(75)[0] == pytest.approx(sched.step(75)[0]) == pytest.approx(1.0)


def test_bad_reference_names_the_option():
    with pytest.raises(ValueError, match="--lr-scaling-reference"):
        batch_size_scale(10, reference=0, rule="linear")

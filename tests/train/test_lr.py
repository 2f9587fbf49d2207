import math

import pytest
import torch

from nmt.config import RunConfig
from nmt.train import VariableBatchSizeLR
from nmt.train.lr import batch_size_scale, build_scheduler, cosine_factor, inverse_sqrt_factor
from nmt.train.stopping import Stopping


def optimizer(lr=1.0):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def scheduler(opt, name, *, lr, scaling="none", reference=0):
    """``build_scheduler`` without warm-up, update limit or floor."""
    return build_scheduler(
        opt,
        name=name,
        lr=lr,
        warmup_updates=0,
        warmup_init_lr=0.0,
        max_update=0,
        min_lr=0.0,
        scaling=scaling,
        scaling_reference=reference,
    )


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
    sched = scheduler(opt, "fixed", lr=1.0, scaling=rule, reference=1000)
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
    sched = scheduler(opt, "fixed", lr=2.0, scaling="sqrt", reference=0)
    assert sched.step(300)[0] == pytest.approx(2.0)
    assert sched.step(1200)[0] == pytest.approx(4.0)
    state = sched.state_dict()
    opt2 = optimizer(lr=2.0)
    restored = scheduler(opt2, "fixed", lr=2.0, scaling="sqrt", reference=0)
    restored.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(4.0)
    assert restored.step(75)[0] == pytest.approx(sched.step(75)[0]) == pytest.approx(1.0)


def test_bad_reference_names_the_option():
    with pytest.raises(ValueError, match="--lr-scaling-reference"):
        batch_size_scale(10, reference=0, rule="linear")


def cosine(step, *, max_update, time_progress=0.0):
    return cosine_factor(
        step,
        warmup_updates=10,
        warmup_init_ratio=0.0,
        max_update=max_update,
        min_ratio=0.1,
        time_progress=time_progress,
    )


def test_cosine_decays_over_the_updates_or_the_time_whichever_is_further():
    assert cosine(5, max_update=110) == pytest.approx(0.5)  # warm-up
    assert cosine(10, max_update=110) == pytest.approx(1.0)
    assert cosine(60, max_update=110) == pytest.approx(0.55)  # half-way: 0.1 + 0.9 * 0.5
    assert cosine(110, max_update=110) == cosine(500, max_update=110) == pytest.approx(0.1)
    # no update limit: the share of the time budget spent decides
    assert cosine(60, max_update=0) == pytest.approx(1.0)
    assert cosine(60, max_update=0, time_progress=0.5) == pytest.approx(0.55)
    assert cosine(60, max_update=0, time_progress=1.3) == pytest.approx(0.1)
    # both limits: the one nearer to stopping the run
    assert cosine(60, max_update=110, time_progress=0.25) == pytest.approx(0.55)
    assert cosine(35, max_update=110, time_progress=0.5) == pytest.approx(0.55)


def test_time_progress_sets_the_next_lr_and_resumes_from_a_weights_only_checkpoint(tmp_path):
    opt = optimizer(lr=2.0)
    sched = scheduler(opt, "cosine", lr=2.0)
    assert sched.step(100)[0] == pytest.approx(2.0)
    sched.follow_time(0.5)
    assert sched.step(100)[0] == pytest.approx(1.0)
    torch.save(sched.state_dict(), tmp_path / "state.pt")
    restored = scheduler(optimizer(lr=2.0), "cosine", lr=2.0)
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert restored.step(100)[0] == pytest.approx(sched.step(100)[0]) == pytest.approx(1.0)
    fixed = scheduler(optimizer(lr=2.0), "fixed", lr=2.0)
    fixed.follow_time(0.9)  # a schedule that does not follow the clock ignores it
    assert fixed.step(100)[0] == pytest.approx(2.0)


def test_the_time_share_comes_from_the_main_rank_alone():
    stopping = Stopping(RunConfig(stop_time_hours=1.0), earlier_seconds=1800.0)
    (main,) = stopping.time_share(is_main=True)
    assert 0.5 <= main < 0.51
    assert stopping.time_share(is_main=False) == [0.0]  # summed over ranks: the main rank's value
    assert Stopping(RunConfig()).time_share(is_main=True) == []

"""The agreement schedule of the ranks (``Agreements``), without a process group: each rank is an
``Agreements`` of its own, and the collective is the sum of their ``own_seconds``."""

import pytest

from nmt.train.stopping import Agreements, next_interval


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_interval_fits_the_target_grows_at_most_twofold_and_is_never_zero():
    assert next_interval(0.5, previous=100, target_seconds=2.0) == 4
    assert next_interval(0.001, previous=8, target_seconds=2.0) == 16  # not 2000 at once
    assert (
        next_interval(30.0, previous=8, target_seconds=2.0) == 1
    )  # an update longer than the target
    assert next_interval(0.0, previous=3, target_seconds=2.0) == 6  # a clock that did not move
    assert next_interval(0.2, previous=50, target_seconds=0.0) == 1  # one rank: every update


def simulate(durations, *, world_size, target_seconds=2.0, signal_at=None):
    """Run the ranks' schedules over updates of ``durations`` seconds (the main rank's clock; the
    others' clocks run apart, as they do). Returns the updates at which the ranks agreed (the same
    list for every rank, or the test fails) and, with ``signal_at`` (seconds), the seconds from the
    signal to the agreement that acts on it."""
    clocks = [FakeClock() for _ in range(world_size)]
    ranks = [
        Agreements(after_update=0, target_seconds=target_seconds, clock=clock) for clock in clocks
    ]
    agreed_at, elapsed, latency = [], 0.0, None
    for update, seconds in enumerate(durations, start=1):
        elapsed += seconds
        for rank, clock in enumerate(clocks):
            clock.now += seconds * (1.0 + 0.3 * rank)  # another rank's clock: never read
        due = [agreements.due(update) for agreements in ranks]
        assert len(set(due)) == 1, f"the ranks disagree on holding the collective at {update}"
        if due[0]:
            summed = sum(a.own_seconds(is_main=rank == 0) for rank, a in enumerate(ranks))
            for agreements in ranks:
                agreements.agreed(summed, update=update)
            agreed_at.append(update)
            if signal_at is not None and latency is None and elapsed >= signal_at:
                latency = elapsed - signal_at
    return agreed_at, latency


def test_every_rank_agrees_at_the_same_updates_and_fast_updates_stretch_the_interval():
    agreed_at, _ = simulate([0.01] * 2000, world_size=3)
    gaps = [b - a for a, b in zip([0, *agreed_at], agreed_at)]
    assert gaps[:6] == [1, 2, 4, 8, 16, 32]  # from one update, doubling
    assert max(gaps) == 200  # then 2 s of 0.01 s updates: 10 agreements in 20 s, not 2000
    assert len(agreed_at) < 30


@pytest.mark.parametrize("seconds_per_update", [0.002, 0.05, 0.8, 5.0])
def test_a_signal_is_agreed_on_within_the_target_whatever_the_update_rate(seconds_per_update):
    """The bug: a signal waited for the next --log-interval update (~8 minutes at 100 updates of 5 s)."""
    num_updates = int(60 / seconds_per_update)
    for signal_at in (13.3, 41.7):
        _, latency = simulate([seconds_per_update] * num_updates, world_size=2, signal_at=signal_at)
        assert latency is not None
        assert latency <= max(2.0, seconds_per_update) + 1e-6


def test_a_slow_down_shortens_the_next_interval():
    agreed_at, latency = simulate([0.01] * 1000 + [0.1] * 300, world_size=2, signal_at=20.0)
    assert latency <= 10 * 2.0  # the interval measured at 0.01 s, run at 0.1 s: 10x the target once
    gaps = [b - a for a, b in zip(agreed_at, agreed_at[1:])]
    assert gaps[-1] == 20  # then re-derived: 2 s of 0.1 s updates


def test_one_rank_agrees_after_every_update():
    agreed_at, _ = simulate([0.01] * 50, world_size=1, target_seconds=0.0)
    assert agreed_at == list(range(1, 51))


def test_a_run_resumed_at_its_max_update_makes_no_more():
    from nmt.config import RunConfig
    from nmt.train.stopping import Stopping

    stopping = Stopping(RunConfig(max_update=6))

    assert stopping.before_start(epoch=3, num_updates=5) is None
    assert stopping.before_start(epoch=3, num_updates=6) == (
        "--max-update 6 reached by the runs this one resumed"
    )

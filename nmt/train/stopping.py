"""Where a run is (``Progress``) and when it ends: limits the host knows (--max-update,
--max-epoch), and those every rank must agree on (a signal, --stop-time-hours), agreed on a clock
(``Agreements``), so every rank stops after the same update within seconds of a signal, whatever
the update rate and --log-interval."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nmt import dist
from nmt.config import RunConfig
from nmt.workers import note_stop_signal

logger = logging.getLogger(__name__)

STOPPED_BY_SIGNAL = "stopped by signal"

# The wall-clock time between two agreements of several ranks: a signal is acted on within about
# that (a scheduler's grace period is often 10 to 30 s), for one small host collective each time.
AGREEMENT_SECONDS = 2.0


@dataclass(frozen=True)
class Progress:
    update: int  # updates done, this one included
    epoch: int  # 1-based: the epoch this update belongs to
    ends_epoch: bool


class StopSignal:
    """SIGTERM/SIGINT remembered, for the run to act on at the ranks' next agreement (finish the
    update, save, exit 0), from ``remember`` (the first update) to the end of the ``with``. Before,
    the handlers in place act: in nmt-train ``nmt.workers.stop_on_signals``'s, which stop the
    start-up at once (there is nothing to save yet)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        return self

    def remember(self) -> None:
        if not self._previous:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        note_stop_signal(signum)
        logger.warning("received signal %d: stopping within seconds, after saving", signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class Agreements:
    """When the ranks next agree on the signals and the clock: every ``interval`` updates,
    re-derived at each agreement from the main rank's clock so that an interval takes about
    ``target_seconds``. Each rank derives it from the same agreed seconds, so all of them hold the
    collective at the same update (a rank alone in a collective would wait in it for good).
    ``target_seconds`` 0: an agreement after every update (one rank, where it costs nothing)."""

    def __init__(
        self,
        *,
        after_update: int,
        target_seconds: float,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target_seconds = target_seconds
        self.interval = 1  # the first updates (warm-up, compilation) are the slowest
        self.last_update = after_update
        self.clock = clock
        self.started = clock()

    def due(self, update: int) -> bool:
        return update >= self.last_update + self.interval

    def own_seconds(self, *, is_main: bool) -> float:
        """For the sum over the ranks: the main rank's seconds since the last agreement (the
        others give 0, so every rank reads the same value bit for bit)."""
        return self.clock() - self.started if is_main else 0.0

    def agreed(self, seconds: float, *, update: int) -> None:
        """``seconds``: the agreed sum of ``own_seconds`` at the agreement after ``update``."""
        per_update = seconds / max(update - self.last_update, 1)
        self.interval = next_interval(
            per_update, previous=self.interval, target_seconds=self.target_seconds
        )
        self.last_update = update
        self.started = self.clock()


def next_interval(seconds_per_update: float, *, previous: int, target_seconds: float) -> int:
    """The updates that fit in ``target_seconds``, at least 1, and at most twice ``previous``: a
    spell of fast updates must not stretch the next interval far beyond the target should the
    updates slow down again (longer batches, another job on the machine)."""
    if seconds_per_update <= 0:  # a clock that did not move: the fastest growth allowed
        return 2 * previous
    return max(1, int(min(target_seconds / seconds_per_update, 2 * previous)))


def agree_on_host(
    flags: Sequence[bool], numbers: Sequence[float]
) -> tuple[list[bool], list[float]]:
    """``flags`` (true where any rank set them) and ``numbers`` (summed) over the ranks, in host
    memory (``.numpy()``: no device, so no wait for one); on one rank they are their own sums."""
    if dist.get_world_size() == 1:
        return list(flags), list(numbers)
    values = torch.tensor([*map(float, flags), *numbers], dtype=torch.float64)
    summed = dist.all_reduce_sum(values).numpy().tolist()
    return [value > 0 for value in summed[: len(flags)]], summed[len(flags) :]


class Stopping:
    def __init__(self, cfg: RunConfig, *, earlier_seconds: float = 0.0) -> None:
        """``earlier_seconds``: the wall clock of the runs this one resumed (--stop-time-hours
        counts them, as fairseq does)."""
        self.cfg = cfg
        self.earlier_seconds = earlier_seconds
        self.limit_seconds = cfg.stop_time_hours * 3600  # 0: no time limit
        self.started = time.perf_counter()

    def elapsed_seconds(self) -> float:
        """This run's wall-clock time, set-up included, plus that of the runs it resumed."""
        return self.earlier_seconds + time.perf_counter() - self.started

    def before_start(self, *, epoch: int, num_updates: int) -> str | None:
        """A resumed run may have nothing left to do; ``epoch``: the 1-based epoch it would start in,
        ``num_updates``: the updates it resumed after (a finished run must not make one more)."""
        if self.cfg.max_update and num_updates >= self.cfg.max_update:
            return f"--max-update {self.cfg.max_update} reached by the runs this one resumed"
        if 0 < self.limit_seconds <= self.earlier_seconds:
            return (
                f"--stop-time-hours {self.cfg.stop_time_hours} reached by the runs this one resumed"
            )
        if self.cfg.max_epoch and epoch > self.cfg.max_epoch:
            return f"--max-epoch {self.cfg.max_epoch} reached"
        return None

    def after_update(self, at: Progress) -> str | None:
        """The limits every rank knows without asking the others."""
        if self.cfg.max_update and at.update >= self.cfg.max_update:
            return f"--max-update {self.cfg.max_update} reached"
        if self.cfg.max_epoch and at.ends_epoch and at.epoch >= self.cfg.max_epoch:
            return f"--max-epoch {self.cfg.max_epoch} reached"
        return None

    def flags(self, stop_signal: StopSignal) -> list[bool]:
        """This rank's view of the limits the ranks must agree on (``agreed`` reads them back)."""
        limit = self.limit_seconds
        return [stop_signal.requested, limit > 0 and self.elapsed_seconds() > limit]

    def time_share(self, *, is_main: bool) -> list[float]:
        """The share of --stop-time-hours spent, for ``read`` to sum over the ranks: the main
        rank's clock alone (the others give 0), so every rank reads the same value bit for bit and
        a schedule driven by it sets the same learning rate everywhere. Empty without the limit."""
        if self.limit_seconds <= 0:
            return []
        return [self.elapsed_seconds() / self.limit_seconds if is_main else 0.0]

    def earlier_share(self) -> float:
        """The share of --stop-time-hours that the runs this one resumed spent (0 without the
        limit): read from the checkpoint, so the same on every rank without a collective."""
        limit = self.limit_seconds
        return self.earlier_seconds / limit if limit > 0 else 0.0

    def agreed(self, flags: list[bool]) -> str | None:
        """The stop reason from ``flags`` as any rank set them."""
        if flags[0]:
            return STOPPED_BY_SIGNAL
        if flags[1]:
            return f"--stop-time-hours {self.cfg.stop_time_hours} reached"
        return None

"""Where a run is (``Progress``) and when it ends: limits the host knows (--max-update,
--max-epoch), and those every rank must agree on (a signal, --stop-time-hours), agreed at the log
points where the device is read anyway, so every rank stops after the same update."""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

from nmt.config import RunConfig

logger = logging.getLogger(__name__)

STOPPED_BY_SIGNAL = "stopped by signal"


@dataclass(frozen=True)
class Progress:
    update: int  # updates done, this one included
    epoch: int  # 1-based: the epoch this update belongs to
    ends_epoch: bool


class StopSignal:
    """SIGTERM/SIGINT: remembered, acted on at the next agreement point (finish, save, exit 0)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        logger.warning("received signal %d: stopping at the next log point", signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


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

    def before_start(self, *, epoch: int) -> str | None:
        """A resumed run may have nothing left to do; ``epoch``: the 1-based epoch it would start in."""
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

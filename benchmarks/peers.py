"""Figures of peer toolkits (fairseq) that a benchmark does not run: stored with their provenance.

A peer measured on another day, machine or model says nothing about a ratio with today's figures
(load, model size and the machine all move the numbers), so a benchmark prints a stored figure as a
row of its own, dated and with its machine, model and command, and divides only by baselines it
measured in the same run (issue 49).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoredPeerFigure:
    peer: str  # the toolkit, its version and command, e.g. "fairseq 0.12.2 fairseq-generate"
    figure: str  # as measured, with its unit, e.g. "48 sentences/s, 780 target tokens/s"
    date: str  # when it was measured (or the earliest record of it)
    machine: str
    model: str  # the model it ran, or (preprocessing) the data it read
    command: str

    def lines(self) -> list[str]:
        """The figure's row and its provenance, to print below a benchmark's own table."""
        return [
            f"stored peer figure (another day's run, not measured here, so no ratio): "
            f"{self.peer}: {self.figure}",
            f"  measured:   {self.date}",
            f"  machine:    {self.machine}",
            f"  model/data: {self.model}",
            f"  command:    {self.command}",
        ]


# The machine every stored fairseq figure was measured on (README's "Results on the 2-core development
# machine").
DEVELOPMENT_MACHINE = "the 2-core development machine (CPU only)"

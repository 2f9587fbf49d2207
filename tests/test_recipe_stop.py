"""A recipe stopped by a signal stops as the signal says, and never records the interrupted step
as done: nmt-train acts on SIGTERM by saving and returning 0, which in the recipe's process looked
like a finished model (a multilingual candidate was recorded done at 1,498 of its 1,500 updates and
the recipe went on to the next one)."""

import os
import signal

import pytest

from nmt import recipe
from nmt.train.stopping import StopSignal
from nmt.workers import Terminated, last_stop_signal, stop_signals_noted


def test_nmt_trains_signal_handler_notes_the_signal_it_acts_on():
    before = stop_signals_noted()
    with StopSignal() as stop:
        stop.remember()
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested
    assert stop_signals_noted() == before + 1 and last_stop_signal() == signal.SIGTERM


def _stopped_early(argv: list[str]) -> int:
    """A command that acted on SIGTERM the way nmt-train does: work saved, exit status 0."""
    with StopSignal() as stop:
        stop.remember()
        os.kill(os.getpid(), signal.SIGTERM)
    return 0


def test_a_command_stopped_by_a_signal_leaves_its_step_not_done(tmp_path, capsys):
    out = tmp_path / "out"
    model = out / "model.pt"

    def train() -> None:
        model.parent.mkdir(parents=True, exist_ok=True)
        model.write_text("half-trained")
        recipe.call("nmt-train", _stopped_early, [])

    later = []
    steps = [
        recipe.Step("the model", {"--max-update": 10}, [str(model)], train),
        recipe.Step("the score", {}, [], lambda: later.append("scored"), always=True),
    ]
    with pytest.raises(Terminated):
        recipe.run_steps(str(out), steps)
    assert not later  # nothing after the stopped step ran
    assert recipe.Record(str(out)).steps["the model"]["done"] is False
    assert recipe.check_steps(str(out), steps)[0].name == "the model"  # a rerun trains on

    assert recipe.run_recipe("run.py", lambda: recipe.run_steps(str(out), steps)) == 143
    assert "run.py: terminated (SIGTERM): run it again to go on" in capsys.readouterr().err


@pytest.mark.parametrize("status,interruption", [(143, Terminated), (130, KeyboardInterrupt)])
def test_a_command_a_signal_stopped_at_start_up_stops_the_recipe(status, interruption):
    with pytest.raises(interruption):
        recipe.call("nmt-preprocess", lambda argv: status, [])

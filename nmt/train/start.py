"""Where a training run starts, decided in one place (the Trainer, before anything is written):
from nothing; from a run's checkpoint, continued under the identity check (its own
checkpoint_last.pt, else a run's --restore-file); or from a weights-only checkpoint (nmt-import's,
an average), a new run whose model is that checkpoint's."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from nmt.checkpoint_io import LAST, load_model_checkpoint
from nmt.config import CheckpointConfig, ModelConfig, from_dict, option_name
from nmt.train.checkpoint import MODEL_OPTIONS_FREE_TO_CHANGE


@dataclass(frozen=True)
class RunStart:
    path: str | None = None  # the checkpoint started from; None: a new run from fresh weights
    state: dict[str, Any] | None = None

    @property
    def resumes(self) -> bool:
        """A run's checkpoint (it has the training state): the run continues."""
        return self.state is not None and "optimizer" in self.state

    def model_config(self, requested: ModelConfig, given: dict[str, Any]) -> ModelConfig:
        """The run's model: ``requested`` (the --arch preset and the flags ``given`` over it), but
        over a weights-only checkpoint that checkpoint's, its shape fixed: of the flags only the
        dropouts and the attention kernel may be ``given``."""
        if self.state is None or self.resumes:
            return requested
        fixed = sorted(set(given) - set(MODEL_OPTIONS_FREE_TO_CHANGE))
        if fixed:
            raise ValueError(
                f"{option_name(fixed[0])}: the model is {self.path}'s (weights only, so its shape "
                "is fixed); only the dropouts and --attention may be given"
            )
        saved = from_dict(ModelConfig, self.state["model_config"])
        return dataclasses.replace(saved, **given)


def run_start(cfg: CheckpointConfig) -> RunStart:
    """The run's own checkpoint_last.pt, else --restore-file, else nothing."""
    last = os.path.join(cfg.save_dir, LAST)
    path = last if os.path.isfile(last) else cfg.restore_file
    return RunStart(path, load_model_checkpoint(path)) if path else RunStart()

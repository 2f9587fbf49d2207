"""The training loop, readable top to bottom.

The data plan (``nmt.data.plan``) decides what each update trains on; ``UpdateStep`` runs it;
each component decides whether it acts after an update: ``Stopping`` (the limits, a signal and
the clock, which the ranks agree on every few seconds: ``Agreements``), ``MetricsLog`` (every
--log-interval updates, where the device is read), ``Validator`` and ``Checkpointer``.
``Trainer.train`` is the order of those calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from tqdm import tqdm

from nmt import dist
from nmt.checkpoint_io import BEST, same_vocab
from nmt.config import ModelConfig, TrainConfig, to_dict
from nmt.data.difficulty import DifficultyScorer
from nmt.data.manifest import Manifest
from nmt.data.plan import TrainingDataPlan, Update
from nmt.device import resolve_device
from nmt.model import build_model
from nmt.train.checkpoint import (
    Checkpointer,
    check_identity,
    lock_save_dir,
    provenance,
    read_vocab,
    rng_state,
    run_identity,
    set_rng_state,
)
from nmt.train.compile import CompiledModel, compile_for_shapes
from nmt.train.metrics import MetricsLog
from nmt.train.parallel import wrap_data_parallel
from nmt.train.start import RunStart, run_start
from nmt.train.step import UpdateStep
from nmt.train.stopping import (
    AGREEMENT_SECONDS,
    STOPPED_BY_SIGNAL,
    Agreements,
    Progress,
    Stopping,
    StopSignal,
    agree_on_host,
)
from nmt.train.validate import Validator
from nmt.workers import signals_deferred

logger = logging.getLogger(__name__)

# A validation callback (built by the CLI from nmt.eval, which nmt.train must not import):
# (unwrapped model, device) -> BLEU on the validation set (per direction on a multilingual one).
BleuValidator = Callable[[torch.nn.Module, torch.device], float | dict[str, float]]


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        model_cfg: ModelConfig,
        *,
        manifest: Manifest | None = None,
        session: dist.Session | None = None,
        bleu_validator: BleuValidator | None = None,
        scorer: DifficultyScorer | None = None,
        model_flags: dict[str, Any] | None = None,
    ) -> None:
        """``manifest``: the dataset's, when the caller has read it already. ``session``: this
        process's rank and device (``nmt.dist.session``); one CPU or CUDA process by
        default. ``scorer``: scores training pairs for ``--curriculum model:``. ``model_flags``:
        the model options given over the preset (all that may change a weights-only start's model)."""
        self.cfg = cfg
        self.session = session or dist.Session(device=resolve_device(cfg.run.device, local_rank=0))
        device, is_main = self.session.device, self.session.is_main
        # Before the lock makes the save dir: a --restore-file that cannot be read leaves nothing.
        self.start: RunStart | None = run_start(cfg.checkpoint)
        self.model_cfg = model_cfg = self.start.model_config(model_cfg, model_flags or {})
        self.lock = lock_save_dir(cfg.checkpoint.save_dir, is_main=is_main)
        self.plan = TrainingDataPlan(
            cfg.data,
            seed=cfg.run.seed,
            rank=self.session.rank,
            world_size=self.session.world_size,
            static_shapes=cfg.run.compile,
            max_positions=(model_cfg.max_source_positions, model_cfg.max_target_positions),
            cache_dir=cfg.checkpoint.save_dir,
            manifest=manifest,
            scorer=scorer,
        )
        # once: every checkpoint carries it (with a multilingual model's directions and tag placement)
        self.vocab = read_vocab(self.plan.manifest, lang_tok=cfg.data.lang_tok)
        self.identity = run_identity(cfg, model_cfg, self.plan.manifest)
        self.provenance = provenance()
        torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank
        self.model = build_model(model_cfg).to(device)
        precision = torch.bfloat16 if cfg.run.bf16 else torch.float16 if cfg.run.fp16 else None
        self.step = UpdateStep(
            self.model,
            wrap_data_parallel(self.model, device=device),
            cfg.optim,
            device=device,
            max_update=cfg.run.max_update,
            precision=precision,
        )
        self.num_updates = 0
        self.stopping = Stopping(cfg.run)
        self.metrics = MetricsLog(
            cfg.logging, enabled=is_main or cfg.logging.log_all_ranks, tensorboard=is_main
        )
        self.validator = Validator(
            cfg.checkpoint,
            evaluate_loss=lambda: {
                name: self.step.evaluate(self.plan.valid_batches(name))
                for name in self.plan.valid_sets
            },
            evaluate_bleu=None if bleu_validator is None else lambda: self._bleu(bleu_validator),
            missing=None
            if self.plan.valid_sets
            else (
                f"{cfg.data.data_dir} has no validation split {cfg.data.valid_subset!r} (nmt-preprocess --validpref)"
            ),
        )
        self.checkpoints = Checkpointer(cfg.checkpoint, is_main=is_main)
        self.compiled: CompiledModel | None = None
        if precision is not None and device.type == "cpu" and self.metrics.enabled:
            logger.warning(
                "--%s on a CPU: autocast there is slower than float32 (up to 4x measured); "
                "it is meant for GPUs",
                "bf16" if cfg.run.bf16 else "fp16",
            )
        if self.metrics.enabled:
            logger.info(
                "rank %d/%d on %s | %d training pairs in %s | model %s, %s: %.2fM parameters | attention backend %s",
                self.session.rank,
                self.session.world_size,
                device,
                self.plan.num_samples,
                ",".join(
                    f"{name} ({len(corpus)})"
                    for name, corpus in zip(self.plan.corpus_names, self.plan.corpora)
                )
                if len(self.plan.corpora) > 1
                else ",".join(cfg.data.train_subsets),
                cfg.run.arch,
                self.model_cfg.shape(),
                sum(p.numel() for p in self.model.parameters()) / 1e6,
                self.model.backend(device),
            )

    # ----------------------------------------------------------------------------- the run
    def train(self) -> int:
        """Train until a limit, a signal or --patience stops the run; the number of updates done.
        From the first update on, a signal stops the run at the ranks' next agreement (within
        seconds), after a checkpoint; before it, the handlers in place act (nmt-train's stop the
        start-up at once: ``nmt.workers.stop_on_signals``)."""
        try:
            with StopSignal() as stop_signal:
                self.resume()
                if self.cfg.run.compile:
                    assert self.plan.static is not None
                    self.compiled = compile_for_shapes(self.step, self.plan.static)
                reason = self.stopping.before_start(
                    epoch=self.plan.epoch, num_updates=self.num_updates
                )
                several = self.session.world_size > 1
                agreements = Agreements(
                    after_update=self.num_updates,
                    target_seconds=AGREEMENT_SECONDS if several else 0.0,
                )
                for update in [] if reason else self.updates():
                    stop_signal.remember()  # the first update has its data: a stop saves from now on
                    self.metrics.count(self.step(update))
                    self.num_updates += 1
                    at = Progress(self.num_updates, update.epoch, update.ends_epoch)
                    if update.ends_epoch:
                        self.plan.end_epoch()
                    reason = self.stopping.after_update(at)
                    log = self.metrics.due(at)
                    if log or agreements.due(at.update):
                        reason = self.agree(at, agreements, stop_signal, log=log) or reason
                    if self.after_update(at, reason):
                        reason = reason or self.validator.patience_reason()
                    if reason:
                        break
            if self.metrics.enabled:
                minutes = self.stopping.elapsed_seconds() / 60
                logger.info("done: %s (%d updates, %.1f min)", reason, self.num_updates, minutes)
            return self.num_updates
        finally:
            self.close()

    def agree(
        self, at: Progress, agreements: Agreements, stop_signal: StopSignal, *, log: bool
    ) -> str | None:
        """Every rank's signal and clock, summed over the ranks; the stop reason they agree on.
        At a log point it rides on the read of the device; elsewhere it is a collective in host
        memory (no device sync), after the same update on every rank (``Agreements``)."""
        is_main = self.session.is_main
        flags = self.stopping.flags(stop_signal)
        numbers = [
            agreements.own_seconds(is_main=is_main),
            *self.stopping.time_share(is_main=is_main),
        ]
        reading = self.step.read(flags=flags, numbers=numbers) if log else None
        if reading is not None:
            flags, numbers = reading.flags, reading.numbers
        else:
            flags, numbers = agree_on_host(flags, numbers)
        seconds, *time_share = numbers
        agreements.agreed(seconds, update=at.update)
        if time_share:
            self.step.scheduler.follow_time(time_share[0])
        if reading is not None:
            self.metrics.log_reading(reading, at=at, lr=self.step.scheduler.get_last_lr()[0])
        return self.stopping.agreed(flags)

    def updates(self) -> Iterator[Update]:
        """The plan's updates, epoch after epoch, with a progress bar and the blend's counts per epoch."""
        while True:
            info = self.plan.begin_epoch()
            if info.first_update == info.num_updates:  # saved after its last update (older nmt)
                self.plan.end_epoch()
                continue
            if info.blend_counts:
                self.metrics.log(
                    info.blend_counts, prefix="blend", update=self.num_updates, epoch=info.epoch
                )
            with tqdm(
                total=info.num_updates,
                initial=info.first_update,
                desc=f"epoch {info.epoch}",
                unit="upd",
                disable=not self.session.is_main or self.cfg.logging.no_progress_bar,
                dynamic_ncols=True,
                mininterval=2.0,
                leave=False,
            ) as progress:
                yield from progress_of(self.plan.updates(), progress)

    def after_update(self, at: Progress, reason: str | None) -> bool:
        """Save and validate when due; True when --patience says stop."""
        validating = self.validator.due(at, stopping=reason, by_signal=reason == STOPPED_BY_SIGNAL)
        names = self.checkpoints.due(at, stopping=reason is not None, validating=validating)
        if names:
            self.save(names, validation_due=validating)
        return validating and self.validate(at)

    def validate(self, at: Progress) -> bool:
        """Validate, log, save checkpoint_best.pt when it is the best; True when --patience says stop."""
        outcome = self.validator()
        self.metrics.log(outcome.metrics, prefix="valid", update=at.update, epoch=at.epoch)
        if outcome.is_best:
            self.save([BEST], validation_due=False)
        return outcome.patience_exhausted

    def _bleu(self, bleu_validator: BleuValidator) -> float | dict[str, float]:
        bleu = bleu_validator(self.model, self.session.device) if self.session.is_main else 0.0
        return dist.broadcast_object(bleu)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.metrics.close()
        self.plan.close()
        self.lock.close()

    # ----------------------------------------------------------------------------- checkpoints
    def save(self, names: list[str], *, validation_due: bool) -> None:
        """Checkpoints ``names``; a signal during start-up (a resume's validation) waits for them,
        so that it never leaves half of a set of names or a rank behind in the save's barrier."""
        with signals_deferred():
            self.checkpoints.save(self.checkpoint_state(validation_due=validation_due), names)

    def checkpoint_state(self, *, validation_due: bool) -> dict[str, Any]:
        """The whole run's state. ``validation_due``: saved just before a validation, whose
        outcome (the meters) it does not hold yet: a resume from it validates first."""
        if not self.session.is_main:
            return {}
        return {
            "model": self.model.state_dict(),
            "model_config": to_dict(self.model_cfg),
            "vocab": self.vocab,
            "train_config": to_dict(self.cfg),
            **self.step.state_dict(),
            "data_plan": self.plan.state_dict(),
            "rng": rng_state(),
            "num_updates": self.num_updates,
            **self.validator.state_dict(),
            "validation_due": validation_due,
            "earlier_seconds": self.stopping.elapsed_seconds(),
            "run_identity": self.identity,
            "provenance": self.provenance,
        }

    def resume(self) -> None:
        """Continue from checkpoint_last.pt (or start from --restore-file): what differs from the
        checkpoint's run is refused, one line per item, unless a --reset-* flag accepts it."""
        self.checkpoints.remove_stale_temporaries()
        start, self.start = self.start, None  # its state (weights, optimizer) is not kept beyond
        if start is None or start.state is None:
            return
        path, state = start.path, start.state
        if not start.resumes:  # weights only (an import, an average): a new run from them
            if not same_vocab(state["vocab"], self.vocab):
                raise ValueError(
                    f"{path}: its vocabulary is not the dataset's; make the dataset with its "
                    "SentencePiece model(s): nmt-preprocess --spm-model (nmt-import wrote them)"
                )
            self.model.load_state_dict(state["model"])
            logger.info(
                "starting from the weights of %s (a new run: it has no training state)", path
            )
            return
        resets = self.cfg.checkpoint
        check_identity(path, state.get("run_identity"), self.identity, resets)
        self.model.load_state_dict(state["model"])
        self.num_updates = int(state["num_updates"])
        self.step.load_state_dict(
            state,
            optimizer=not resets.reset_optimizer,
            lr_scheduler=not resets.reset_lr_scheduler,
            num_updates=self.num_updates,
        )
        set_rng_state(state["rng"])
        if resets.reset_dataloader:
            self.plan.load_state_dict(
                {"epoch": 0, "epoch_start_update": self.num_updates, "updates_done": 0}
            )
        else:
            self.plan.load_state_dict(state["data_plan"])
        self.stopping = Stopping(
            self.cfg.run, earlier_seconds=float(state.get("earlier_seconds", 0.0))
        )
        # From the first update on, not the first log point: a fresh schedule
        # (--reset-lr-scheduler) would otherwise start at the peak lr of a spent time budget.
        self.step.scheduler.follow_time(self.stopping.earlier_share())
        if not resets.reset_meters:
            self.validator.load_state_dict(state)
        if self.metrics.enabled:
            logger.info(
                "resumed from %s: epoch %d, update %d, update %d of the epoch",
                path,
                self.plan.epoch,
                self.num_updates,
                self.plan.updates_done,
            )
        if state.get("validation_due") and self.validator.enabled:
            # The saved run stopped before it could record this validation: do it again (the
            # same weights give the same scores), so the meters are those of an unbroken run.
            self.validate(Progress(self.num_updates, self.plan.epoch, ends_epoch=False))


def progress_of(updates: Iterator[Update], bar: tqdm) -> Iterator[Update]:
    """``updates``, the bar moved on after each has been handled."""
    for update in updates:
        yield update
        bar.update(1)

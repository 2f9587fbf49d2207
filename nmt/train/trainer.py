"""The training loop, readable top to bottom: step, validate, save, log.

The data plan (``nmt.data.plan``) decides what each update trains on; ``UpdateStep`` runs it;
``Checkpointer`` and ``MetricsLog`` keep the files and the records. Everything here is the order of
those calls: an epoch is a run of updates, then validation and a save; a run ends on
--max-update, --max-epoch, --stop-time-hours, --patience or a signal.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from nmt import dist
from nmt.checkpoint_io import BEST, LAST, same_vocab
from nmt.config import ModelConfig, TrainConfig, to_dict
from nmt.data.difficulty import DifficultyScorer
from nmt.data.manifest import Manifest
from nmt.data.plan import TrainingDataPlan
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
from nmt.train.parallel import Session, resolve_device, wrap_data_parallel
from nmt.train.step import UpdateStep, to_device

logger = logging.getLogger(__name__)
STOPPED_BY_SIGNAL = "stopped by signal"

# A validation callback (built by the CLI from nmt.eval, which nmt.train must not import):
# (unwrapped model, device) -> BLEU on the validation set.
BleuValidator = Callable[[torch.nn.Module, torch.device], float]


@dataclass
class TrainState:
    num_updates: int = 0
    best: float | None = None
    bad_validations: int = 0  # for --patience
    # Wall-clock seconds of the earlier runs this one resumed: --stop-time-hours counts them, as fairseq does.
    earlier_seconds: float = 0.0


class StopSignal:
    """SIGTERM/SIGINT: finish the current update, save, exit 0."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        logger.warning("received signal %d: stopping after this update", signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        model_cfg: ModelConfig,
        *,
        manifest: Manifest | None = None,
        session: Session | None = None,
        bleu_validator: BleuValidator | None = None,
        scorer: DifficultyScorer | None = None,
    ) -> None:
        """``manifest``: the dataset's, when the caller has read it already. ``session``: this
        process's rank and device (``nmt.train.parallel.session``); one CPU or CUDA process by
        default. ``scorer``: scores training pairs for ``--curriculum model:``."""
        self.cfg, self.model_cfg = cfg, model_cfg
        self.session = session or Session(device=resolve_device(cfg.run.device, local_rank=0))
        self.bleu_validator = bleu_validator
        device = self.session.device
        self.lock = lock_save_dir(cfg.checkpoint.save_dir, is_main=self.session.is_main)
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
        self.vocab = read_vocab(self.plan.manifest)  # once: every checkpoint carries it
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
        self.checkpoints = Checkpointer(cfg.checkpoint, is_main=self.session.is_main)
        self.metrics = MetricsLog(
            cfg.logging,
            enabled=self.session.is_main or cfg.logging.log_all_ranks,
            tensorboard=self.session.is_main,
        )
        self.state = TrainState()
        self.compiled: CompiledModel | None = None
        self.started = time.perf_counter()
        if precision is not None and device.type == "cpu" and self.metrics.enabled:
            logger.warning(
                "--%s on a CPU: autocast there is slower than float32 (up to 4x measured); "
                "it is meant for GPUs",
                "bf16" if cfg.run.bf16 else "fp16",
            )
        if self.metrics.enabled:
            logger.info(
                "rank %d/%d on %s | %d training pairs in %s | model %s: %.2fM parameters | attention backend %s",
                self.session.rank,
                self.session.world_size,
                device,
                self.plan.num_samples,
                ",".join(cfg.data.train_subsets),
                cfg.run.arch,
                sum(p.numel() for p in self.model.parameters()) / 1e6,
                self.model.backend(device),
            )

    def close(self) -> None:
        self.metrics.close()
        self.plan.close()
        self.lock.close()

    # ----------------------------------------------------------------------------- the run
    def train(self) -> TrainState:
        try:
            return self.run()
        finally:
            self.close()

    def run(self) -> TrainState:
        cfg = self.cfg
        self.checkpoints.remove_stale_temporaries()
        self.resume()
        if cfg.run.compile:
            assert self.plan.static is not None
            self.compiled = compile_for_shapes(
                self.step.wrapped,
                self.plan.static,
                self.step.forward_loss,
                device=self.session.device,
                world_size=self.session.world_size,
                to_device=lambda batch: to_device(batch, self.session.device),
            )
            self.step.runner = self.compiled.module
        stop_reason = None
        with StopSignal() as stop_signal:
            while stop_reason is None:
                if 0 < cfg.run.stop_time_hours * 3600 <= self.state.earlier_seconds:
                    stop_reason = f"--stop-time-hours {cfg.run.stop_time_hours} reached by the runs this one resumed"
                    break
                if cfg.run.max_epoch and self.plan.epoch >= cfg.run.max_epoch:
                    stop_reason = f"--max-epoch {cfg.run.max_epoch} reached"
                    break
                stop_reason = self.train_epoch(stop_signal)
                if stop_reason is None:
                    self.plan.end_epoch()
                    self.save(end_of_epoch=True)
                    if (
                        self.plan.epoch % cfg.checkpoint.validate_interval == 0
                        and self.validate_and_save()
                    ):
                        stop_reason = self.patience_reason()
        if self.metrics.enabled:
            logger.info(
                "done: %s (%d updates, %.1f min)",
                stop_reason,
                self.state.num_updates,
                self.elapsed_seconds() / 60,
            )
        return self.state

    def train_epoch(self, stop_signal: StopSignal) -> str | None:
        """Run the rest of the current epoch; a stop reason, or None when the epoch ended."""
        info = self.plan.begin_epoch()
        if info.blend_counts:
            self.log(info.blend_counts, prefix="blend")
        with tqdm(
            total=info.num_updates,
            initial=info.first_update,
            desc=f"epoch {info.epoch + 1}",
            unit="upd",
            disable=not self.session.is_main or self.cfg.logging.no_progress_bar,
            dynamic_ncols=True,
            mininterval=2.0,
            leave=False,
        ) as progress:
            for update in self.plan.updates():
                stats = self.step(update)
                self.state.num_updates += 1
                progress.update(1)
                extra = {
                    "loss_scale": self.step.scaler.get_scale() if self.cfg.run.fp16 else 1.0,
                    "skipped": self.step.skipped_updates,
                }
                record = self.metrics.record_update(
                    stats, update=self.state.num_updates, epoch=info.epoch + 1, extra=extra
                )
                if record is not None:
                    progress.set_postfix(loss=f"{stats.loss:.3f}", wps=f"{record['wps']:.0f}")
                reason = self.after_update(
                    stop_signal, at_end=self.plan.updates_done == info.num_updates
                )
                if reason:
                    return reason
        return None

    def after_update(self, stop_signal: StopSignal, *, at_end: bool) -> str | None:
        """Validate and save when due (the epoch's end does both anyway: ``at_end``); a stop reason."""
        cfg = self.cfg.checkpoint
        reason = self.stop_reason_after_update(stop_signal)
        interval_validation = (
            bool(cfg.validate_interval_updates)
            and self.state.num_updates % cfg.validate_interval_updates == 0
        )
        # A run that ends here (--max-update, --stop-time-hours) validates its last update, as
        # fairseq does: checkpoint_best.pt then exists however short the run. A signal stops
        # without that wait.
        validating = (interval_validation and not at_end) or (
            reason is not None and reason != STOPPED_BY_SIGNAL
        )
        interval_save = (
            bool(cfg.save_interval_updates)
            and self.state.num_updates % cfg.save_interval_updates == 0
        )
        if reason or validating or (interval_save and not at_end):
            self.save(end_of_epoch=False)
        if validating and self.validate_and_save():
            reason = reason or self.patience_reason()
        return reason

    def stop_reason_after_update(self, stop_signal: StopSignal) -> str | None:
        run = self.cfg.run
        out_of_time = (
            run.stop_time_hours > 0 and self.elapsed_seconds() > run.stop_time_hours * 3600
        )
        # Every rank must stop at the same update: agree on signals and the clock.
        flags = dist.all_reduce_max(
            torch.tensor([int(stop_signal.requested), int(out_of_time)], dtype=torch.int64)
        )
        if flags[0]:
            return STOPPED_BY_SIGNAL
        if flags[1]:
            return f"--stop-time-hours {run.stop_time_hours} reached"
        if run.max_update and self.state.num_updates >= run.max_update:
            return f"--max-update {run.max_update} reached"
        return None

    def elapsed_seconds(self) -> float:
        """This run's wall-clock time, set-up included, plus that of the runs it resumed."""
        return self.state.earlier_seconds + time.perf_counter() - self.started

    def patience_reason(self) -> str:
        patience = self.cfg.checkpoint.patience
        return f"no improvement in {patience + 1} validations (--patience {patience})"

    # ----------------------------------------------------------------------------- validation
    def validate_and_save(self) -> bool:
        """Validate (the state is saved just before, so a crash here loses nothing), then save the
        outcome (checkpoint_last.pt, checkpoint_best.pt when it is the best); True: --patience stops."""
        is_best, patience_stop = self.validate()
        self.save(end_of_epoch=False, is_best=is_best, numbered=False)
        return patience_stop

    def validate(self) -> tuple[bool, bool]:
        """Validation loss (and BLEU); (is this the best model so far, should --patience stop)."""
        if self.plan.valid is None:
            return False, False
        loss, nll = self.step.evaluate(self.plan.valid_batches())
        metrics = {"valid_loss": loss, "valid_nll": nll, "valid_ppl": 2**nll}
        if self.bleu_validator is not None:
            bleu = (
                self.bleu_validator(self.model, self.session.device)
                if self.session.is_main
                else 0.0
            )
            metrics["valid_bleu"] = float(dist.broadcast_object(bleu))
        self.log(metrics, prefix="valid")
        bleu_metric = self.cfg.checkpoint.best_checkpoint_metric == "bleu"
        value = metrics["valid_bleu"] if bleu_metric else metrics["valid_loss"]
        improved = self.state.best is None or (
            value > self.state.best if bleu_metric else value < self.state.best
        )
        if improved:
            self.state.best = value
            self.state.bad_validations = 0
        else:
            self.state.bad_validations += 1
        return improved, 0 <= self.cfg.checkpoint.patience < self.state.bad_validations

    def log(self, values: dict[str, Any], *, prefix: str) -> None:
        self.metrics.log(
            values, prefix=prefix, update=self.state.num_updates, epoch=self.plan.epoch + 1
        )

    # ----------------------------------------------------------------------------- checkpoints
    def save(self, *, end_of_epoch: bool, is_best: bool = False, numbered: bool = True) -> None:
        """checkpoint_last.pt, and the numbered and best names that are due. ``end_of_epoch``: after
        ``plan.end_epoch()``, so the plan's epoch counts the epochs done."""
        epoch = self.plan.epoch if end_of_epoch else self.plan.epoch + 1  # 1-based, as logged
        names = self.checkpoints.names(
            epoch=epoch,
            num_updates=self.state.num_updates,
            end_of_epoch=end_of_epoch,
            is_best=is_best,
        )
        if not numbered:
            names = [name for name in names if name in (LAST, BEST)]
        self.checkpoints.save(self.checkpoint_state() if self.session.is_main else {}, names)

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "model_config": to_dict(self.model_cfg),
            "vocab": self.vocab,
            "train_config": to_dict(self.cfg),
            **self.step.state_dict(),
            "data_plan": self.plan.state_dict(),
            "rng": rng_state(),
            "epoch": self.plan.epoch,
            **dataclasses.asdict(self.state),
            "earlier_seconds": self.elapsed_seconds(),
            "run_identity": self.identity,
            "provenance": self.provenance,
        }

    def resume(self) -> bool:
        """Continue from checkpoint_last.pt (or start from --restore-file): what differs from the
        checkpoint's run is refused, one line per item, unless a --reset-* flag accepts it."""
        found = self.checkpoints.load_last()
        if found is None:
            return False
        path, state = found
        if "optimizer" not in state:  # weights only (an import, an average): a new run from them
            if not same_vocab(state["vocab"], self.vocab):
                raise ValueError(
                    f"{path}: its vocabulary is not the dataset's; make the dataset with its "
                    "SentencePiece model(s): nmt-preprocess --spm-model (nmt-import wrote them)"
                )
            self.model.load_state_dict(state["model"])
            logger.info(
                "starting from the weights of %s (a new run: it has no training state)", path
            )
            return False
        resets = self.cfg.checkpoint
        check_identity(path, state.get("run_identity"), self.identity, resets)
        self.model.load_state_dict(state["model"])
        self.step.load_state_dict(
            state,
            optimizer=not resets.reset_optimizer,
            lr_scheduler=not resets.reset_lr_scheduler,
            num_updates=int(state["num_updates"]),
        )
        set_rng_state(state["rng"])
        num_updates = int(state["num_updates"])
        if resets.reset_dataloader:
            self.plan.load_state_dict(
                {"epoch": 0, "epoch_start_update": num_updates, "updates_done": 0}
            )
        else:
            self.plan.load_state_dict(state["data_plan"])
        self.state = TrainState(
            num_updates=num_updates, earlier_seconds=float(state.get("earlier_seconds", 0.0))
        )
        if not resets.reset_meters:
            self.state.best, self.state.bad_validations = (
                state["best"],
                int(state["bad_validations"]),
            )
        if self.metrics.enabled:
            logger.info(
                "resumed from %s: epoch %d, update %d, update %d of the epoch",
                path,
                self.plan.epoch + 1,
                self.state.num_updates,
                self.plan.updates_done,
            )
        return True

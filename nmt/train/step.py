"""One optimizer update: forward/backward over this rank's micro-batches, normalise once, step.

The gradient is that of sum(loss) / (the update's target tokens over all ranks): each micro-batch's
loss sum is scaled by W / tokens before backward (DDP averages over the W ranks), so W ranks x U
accumulation steps and 1 rank x W*U steps take the same step. Dropout is seeded per micro-batch
from the data (``MicroBatch.seed``), never from the rank.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from nmt import dist
from nmt.config import OptimConfig
from nmt.data.plan import Update
from nmt.data.spm import PAD_ID
from nmt.model import TransformerModel
from nmt.model.transformer import packed_masks
from nmt.train.loss import linear_label_smoothed_cross_entropy
from nmt.train.lr import VariableBatchSizeLR, build_scheduler
from nmt.train.parallel import maybe_no_sync

logger = logging.getLogger(__name__)


@dataclass
class UpdateStats:
    loss: float  # per target token, base 2 (as fairseq reports it)
    nll: float
    ntokens: int
    nsentences: int
    grad_norm: float
    lr: float
    padded_tokens: int  # source + target positions on this rank and all others, padding included
    real_tokens: int  # source + target tokens
    skipped: bool = False


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


class UpdateStep:
    def __init__(
        self,
        model: TransformerModel,
        wrapped: torch.nn.Module,
        cfg: OptimConfig,
        *,
        device: torch.device,
        max_update: int,
        precision: torch.dtype | None = None,
    ) -> None:
        self.model = model  # the module itself: its state dict, its parameters
        self.wrapped = wrapped  # DDP over several ranks (its no_sync), else the module
        self.runner: torch.nn.Module = (
            wrapped  # what runs the training forward: ``wrapped``, or it compiled
        )
        self.cfg = cfg
        self.device = device
        self.precision = precision
        # Adam with decoupled weight decay, as fairseq's adam; fused: one kernel over all parameters
        # instead of ~10 elementwise ops per tensor.
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.lr,
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            fused=True,
        )
        self.scheduler: VariableBatchSizeLR = build_scheduler(
            self.optimizer,
            name=cfg.lr_scheduler,
            lr=cfg.lr,
            warmup_updates=cfg.warmup_updates,
            warmup_init_lr=cfg.warmup_init_lr,
            max_update=max_update,
            min_lr=cfg.min_lr,
            scaling=cfg.lr_scaling,
            scaling_reference=cfg.lr_scaling_reference,
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == torch.float16)
        self.consecutive_nonfinite = 0
        self.skipped_updates = 0

    # ----------------------------------------------------------------------------- forward
    def forward_loss(
        self, model: torch.nn.Module, batch: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss sum, nll sum) over the real target tokens of one micro-batch (already on the device)."""
        extra: dict[str, Any] = {}
        if "src_cu_seqlens" in batch:  # packed
            # Built here, eager: a compiled model sees token counts only, never the per-sample sizes.
            masks = packed_masks(
                self.model.backend(self.device),
                batch["src_lengths"],
                batch["tgt_lengths"],
                num_src=batch["src_tokens"].shape[0],
                num_tgt=batch["prev_output_tokens"].shape[0],
                src_cu_seqlens=batch["src_cu_seqlens"],
                tgt_cu_seqlens=batch["tgt_cu_seqlens"],
                src_positions=batch["src_positions"],
                tgt_positions=batch["tgt_positions"],
            )
            extra = dict(packed=True, masks=masks)
        autocast = (
            torch.autocast(self.device.type, dtype=self.precision)
            if self.precision
            else contextlib.nullcontext()
        )
        with autocast:
            # With masks, a packed forward needs no lengths (and must not get them: see above).
            src_lengths, tgt_lengths = (
                (None, None) if extra else (batch["src_lengths"], batch["tgt_lengths"])
            )
            hidden = model(
                batch["src_tokens"], src_lengths, batch["prev_output_tokens"], tgt_lengths, **extra
            )
        target = batch["target"]
        real = (
            target != PAD_ID
        )  # project only real positions: the 8k-way output is the costliest op
        return linear_label_smoothed_cross_entropy(
            hidden[real],
            self.model.output_projection.weight,
            target[real],
            epsilon=self.cfg.label_smoothing,
            bias=self.model.output_projection.bias,
        )

    # ----------------------------------------------------------------------------- the update
    def __call__(self, update: Update) -> UpdateStats:
        self.wrapped.train()
        world = dist.get_world_size()
        sums = torch.zeros(4, dtype=torch.float64)  # loss, nll, padded tokens, real tokens
        scale = world / max(update.num_tokens, 1)  # DDP averages over ranks, hence the factor W
        for position, micro in enumerate(update.micro_batches):
            batch = to_device(micro.batch, self.device)
            torch.manual_seed(micro.seed)
            with maybe_no_sync(self.wrapped, sync=position == len(update.micro_batches) - 1):
                loss, nll = self.forward_loss(self.runner, batch)
                # A dummy keeps DDP in step but carries no gradient.
                self.scaler.scale(loss * (0.0 if micro.dummy else scale)).backward()
            if not micro.dummy:
                padded = batch["src_tokens"].numel() + batch["target"].numel()
                real = batch["src_lengths"].sum() + batch["tgt_lengths"].sum()
                sums += torch.tensor(
                    [loss.item(), nll.item(), float(padded), float(real)], dtype=torch.float64
                )
        dist.all_reduce_sum(sums)
        batch_size = (
            update.num_sentences if self.cfg.lr_scaling_by == "sentences" else update.num_tokens
        )
        lr = self.scheduler.step(batch_size)[0]
        grad_norm, skipped = self._step(loss_is_finite=math.isfinite(float(sums[0])))
        tokens = max(update.num_tokens, 1)
        return UpdateStats(
            loss=float(sums[0]) / tokens / math.log(2),
            nll=float(sums[1]) / tokens / math.log(2),
            ntokens=update.num_tokens,
            nsentences=update.num_sentences,
            grad_norm=grad_norm,
            lr=lr,
            padded_tokens=int(sums[2]),
            real_tokens=int(sums[3]),
            skipped=skipped,
        )

    def _step(self, *, loss_is_finite: bool) -> tuple[float, bool]:
        """Clip and step (or skip a non-finite update); (gradient norm, skipped)."""
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.cfg.clip_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm))
        else:
            grad_norm = float(
                torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(p.grad) for p in params])
                )
            )
        skipped = False
        if self.scaler.is_enabled():
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = (
                self.scaler.get_scale() < scale_before
            )  # overflow: step skipped, scale lowered
        elif math.isfinite(grad_norm) and loss_is_finite:
            self.optimizer.step()
            self.consecutive_nonfinite = 0
        else:
            skipped = True
            self.consecutive_nonfinite += 1
            self.skipped_updates += 1
            logger.warning(
                "non-finite loss or gradient (grad norm %s): update skipped (%d in a row)",
                grad_norm,
                self.consecutive_nonfinite,
            )
            if self.consecutive_nonfinite >= self.cfg.max_consecutive_nonfinite:
                raise RuntimeError(
                    f"{self.consecutive_nonfinite} consecutive updates with a non-finite loss or gradient: "
                    "stopping (lower --lr, raise --warmup-updates, or use --clip-norm)"
                )
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, skipped

    @torch.no_grad()
    def evaluate(self, batches: Any) -> tuple[float, float]:
        """(loss, nll) per target token in base 2 over ``batches``, summed over all ranks."""
        self.wrapped.eval()
        sums = torch.zeros(3, dtype=torch.float64)
        for cpu_batch in batches:
            batch = to_device(cpu_batch, self.device)
            loss, nll = self.forward_loss(self.model, batch)
            sums += torch.tensor(
                [loss.item(), nll.item(), float((batch["target"] != PAD_ID).sum())],
                dtype=torch.float64,
            )
        dist.all_reduce_sum(sums)
        tokens = max(float(sums[2]), 1.0)
        return float(sums[0]) / tokens / math.log(2), float(sums[1]) / tokens / math.log(2)

    # ----------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "skipped_updates": self.skipped_updates,
        }

    def load_state_dict(
        self,
        state: dict[str, Any],
        *,
        optimizer: bool = True,
        lr_scheduler: bool = True,
        num_updates: int = 0,
    ) -> None:
        """``optimizer=False``: keep the fresh optimizer (--reset-optimizer); ``lr_scheduler=False``:
        keep the fresh schedule, moved on to ``num_updates`` (--reset-lr-scheduler)."""
        if optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
        if lr_scheduler:
            self.scheduler.load_state_dict(state["lr_scheduler"])
        else:
            self.scheduler.fast_forward(num_updates)
        self.skipped_updates = int(state["skipped_updates"])

"""One optimizer update: forward/backward over this rank's micro-batches, normalise once, step.

The gradient is that of sum(loss) / (the update's target tokens over all ranks): each micro-batch's
loss sum is scaled by W / tokens before backward (DDP averages over the W ranks), so W ranks x U
accumulation steps and 1 rank x W*U steps take the same step. Dropout is seeded per micro-batch
from the data (``MicroBatch.seed``), never from the rank.

Nothing in an update waits for the device: the loss sums, the gradient norm and the skip counters
stay on it (``RunningSums``) and are read once per log interval; a non-finite gradient skips the
step inside the fused optimizer (its ``found_inf`` input, as GradScaler uses it), not by a host
decision. Host data (lengths, token counts) comes from the data plan as plain integers.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nmt import dist
from nmt.config import OptimConfig
from nmt.data.plan import Update
from nmt.device import move_batch
from nmt.model import TransformerModel
from nmt.model.transformer import PackedMasks, packed_masks
from nmt.train.loss import linear_label_smoothed_cross_entropy
from nmt.train.lr import VariableBatchSizeLR, build_scheduler
from nmt.train.parallel import maybe_no_sync

logger = logging.getLogger(__name__)


@dataclass
class UpdateStats:
    """What the host knows of an update without asking the device."""

    ntokens: int  # target tokens of the update, all ranks
    nsentences: int
    lr: float
    padded_tokens: int  # source + target positions on this rank, padding included
    real_tokens: int  # source + target tokens on this rank


@dataclass
class Reading:
    """The device's running sums at a read point, the window's losses summed over all ranks."""

    loss: float  # label-smoothed loss summed over the window's target tokens (natural log)
    nll: float
    grad_norm: float  # of the last update
    skipped_updates: int  # in the whole run: non-finite gradients and fp16 overflows
    longest_nonfinite_run: int  # updates in a row with a non-finite gradient (fp16 overflows aside)
    loss_scale: float  # fp16's; 1.0 otherwise
    flags: list[bool]  # the host flags given to ``read``, true when any rank set them
    numbers: list[float]  # the host numbers given to ``read``, summed over the ranks


class RunningSums:
    """Sums an update adds to without waiting for the device; ``read`` gets them in one copy."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.losses = torch.zeros(
            2, dtype=torch.float64, device=device
        )  # loss, nll since the last read
        # skipped updates, current run of non-finite updates, longest run since the last read
        self.counters = torch.zeros(3, dtype=torch.float64, device=device)
        self.grad_norm = torch.zeros((), dtype=torch.float64, device=device)

    def add_loss(self, loss: torch.Tensor, nll: torch.Tensor) -> None:
        self.losses += torch.stack([loss.detach(), nll]).double()

    def count_update(self, nonfinite: torch.Tensor, *, counts_as_divergence: bool) -> None:
        """``nonfinite``: 0-d float, 1.0 when this update was skipped. An fp16 overflow is skipped
        and counted but is no sign of divergence (the loss scale adapts), so it never extends a run."""
        skipped, run, longest = self.counters.unbind()
        skipped.add_(nonfinite)
        if counts_as_divergence:
            run.add_(nonfinite).mul_(nonfinite)  # +1 on a skip, back to 0 on a good update
            torch.maximum(longest, run, out=longest)

    def read(
        self,
        *,
        flags: Sequence[bool] = (),
        numbers: Sequence[float] = (),
        loss_scale: torch.Tensor | float = 1.0,
    ) -> Reading:
        """All-reduce the window's losses with ``flags`` and ``numbers`` (summed over ranks; one
        collective on the device), copy everything to the host once, and start the next window."""
        reduced = torch.cat(
            [
                self.losses,
                torch.tensor([*map(float, flags), *numbers], dtype=torch.float64).to(self.device),
            ]
        )
        dist.all_reduce_sum(reduced)
        scale = torch.as_tensor(loss_scale, dtype=torch.float64).to(self.device).reshape(1)
        values = torch.cat([reduced, self.counters, self.grad_norm.reshape(1), scale]).tolist()
        loss, nll = values[:2]
        own = 2 + len(flags) + len(numbers)  # where this rank's own values start
        skipped, _, longest = values[own : own + 3]
        self.losses.zero_()
        self.counters[2] = self.counters[
            1
        ]  # the longest run of the next window starts from the current one
        return Reading(
            loss=loss,
            nll=nll,
            grad_norm=values[own + 3],
            skipped_updates=int(skipped),
            longest_nonfinite_run=int(longest),
            loss_scale=values[own + 4],
            flags=[value > 0 for value in values[2 : 2 + len(flags)]],
            numbers=values[2 + len(flags) : own],
        )

    def state_dict(self) -> dict[str, Any]:
        skipped, run, _ = self.counters.tolist()
        return {"skipped_updates": int(skipped), "nonfinite_run": int(run)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        run = float(state.get("nonfinite_run", 0))
        self.counters.copy_(torch.tensor([float(state["skipped_updates"]), run, run]))


class UpdateStep:
    def __init__(
        self,
        model: TransformerModel,
        runner: torch.nn.Module,
        cfg: OptimConfig,
        *,
        device: torch.device,
        max_update: int,
        precision: torch.dtype | None = None,
    ) -> None:
        """``model``: the module (its parameters and state dict); ``runner``: what runs its
        training forward (DDP over several ranks, the module itself otherwise; compiled later by
        ``use_runner``)."""
        self.model = model
        self.runner = runner
        self.cfg = cfg
        self.device = device
        self.precision = precision
        # Adam with decoupled weight decay, as fairseq's adam; fused: one kernel over all parameters
        # instead of ~10 elementwise ops per tensor, and a step it skips itself on a non-finite
        # gradient (``found_inf``) without the host looking.
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
        self.sums = RunningSums(device)

    def use_runner(self, runner: torch.nn.Module) -> None:
        """Run the training forward through ``runner`` from now on (the compiled model)."""
        self.runner = runner

    # ----------------------------------------------------------------------------- forward
    def masks(self, batch: dict[str, Any]) -> PackedMasks | None:
        """A packed batch's attention masks, built from its host-side lengths and moved to the
        device (None for a padded batch): the sizes inside are host integers, so building them on
        the device would mean reading it."""
        if "src_cu_seqlens" not in batch:
            return None
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
        return masks.to(self.device)

    def forward_loss(
        self, batch: dict[str, Any], *, training: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss sum, nll sum) over the real target tokens of one host-side micro-batch, computed on
        the device by ``runner`` (training) or the module (evaluation)."""
        masks = self.masks(batch)
        on_device = move_batch(batch, self.device)
        model = self.runner if training else self.model
        autocast = (
            torch.autocast(self.device.type, dtype=self.precision)
            if self.precision
            else contextlib.nullcontext()
        )
        with autocast:
            if masks is not None:
                # A compiled model sees token counts only, never the per-sample sizes in the masks.
                hidden = model(
                    on_device["src_tokens"],
                    None,
                    on_device["prev_output_tokens"],
                    None,
                    packed=True,
                    masks=masks,
                )  # (Nt, D)
            else:
                hidden = model(
                    on_device["src_tokens"],
                    on_device["src_lengths"],
                    on_device["prev_output_tokens"],
                    on_device["tgt_lengths"],
                )  # (B, T, D)
        # Project only real target positions (the output projection is the costliest op); their
        # index comes from the host, as boolean-mask indexing would wait for the device.
        index = on_device["target_index"]  # (num real,)
        return linear_label_smoothed_cross_entropy(
            real_rows(hidden.reshape(-1, hidden.shape[-1]), index),
            self.model.output_projection.weight,
            real_rows(on_device["target"].reshape(-1), index),
            epsilon=self.cfg.label_smoothing,
            bias=self.model.output_projection.bias,
        )

    # ----------------------------------------------------------------------------- the update
    def __call__(self, update: Update) -> UpdateStats:
        self.runner.train()
        scale = dist.get_world_size() / max(update.num_tokens, 1)  # DDP averages over ranks: x W
        padded = real = 0
        for position, micro in enumerate(update.micro_batches):
            torch.manual_seed(micro.seed)
            with maybe_no_sync(self.runner, sync=position == len(update.micro_batches) - 1):
                loss, nll = self.forward_loss(micro.batch)
                # A dummy keeps DDP in step but carries no gradient.
                self.scaler.scale(loss * (0.0 if micro.dummy else scale)).backward()
            if not micro.dummy:
                self.sums.add_loss(loss, nll)
                padded += micro.padded_tokens
                real += micro.real_tokens
        batch_size = (
            update.num_sentences if self.cfg.lr_scaling_by == "sentences" else update.num_tokens
        )
        lr = self.scheduler.step(batch_size)[0]
        self._step()
        return UpdateStats(
            ntokens=update.num_tokens,
            nsentences=update.num_sentences,
            lr=lr,
            padded_tokens=padded,
            real_tokens=real,
        )

    def _step(self) -> None:
        """Clip and step; a non-finite gradient (a non-finite loss makes one: the loss's gradient is
        softmax - target) skips the step on the device. The gradient is the same on every rank
        after DDP's all-reduce, so every rank skips the same updates."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        fp16 = self.scaler.is_enabled()
        if fp16:
            self.scaler.unscale_(self.optimizer)  # clip the true gradient, then step
        grad_norm = (
            self._clip(params) if fp16 else torch.nn.utils.get_total_norm([p.grad for p in params])
        )
        # 0-d, 1.0: skipped. x - x is nan only for an inf or a nan: 3 operations, isfinite's 6.
        nonfinite = (grad_norm - grad_norm).isnan().float()
        if fp16:
            self.scaler.step(self.optimizer)  # the fused optimizer takes the scaler's found_inf
            self.scaler.update()
        else:
            # The fused optimizer divides the gradient by grad_scale in its own pass: clipping
            # there spares a multiplication over every gradient. found_inf skips the step.
            if self.cfg.clip_norm > 0:
                self.optimizer.grad_scale = (grad_norm / self.cfg.clip_norm).clamp(min=1.0).float()
            self.optimizer.found_inf = nonfinite
            self.optimizer.step()
            self.optimizer.__dict__.pop("grad_scale", None)
            del self.optimizer.found_inf
        self.sums.grad_norm.copy_(grad_norm)
        self.sums.count_update(nonfinite, counts_as_divergence=not fp16)
        self.optimizer.zero_grad(set_to_none=True)

    def _clip(self, params: list[torch.Tensor]) -> torch.Tensor:
        """The gradient norm, after clipping to --clip-norm (0: no clipping)."""
        if self.cfg.clip_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_norm)
        return torch.nn.utils.get_total_norm([p.grad for p in params])

    def read(self, *, flags: Sequence[bool] = (), numbers: Sequence[float] = ()) -> Reading:
        """The window's sums and the run's counters (see ``RunningSums.read``); RuntimeError once
        --max-consecutive-nonfinite updates in a row had a non-finite gradient."""
        # The scale as the scaler's own tensor (get_scale() would read the device).
        scale = self.scaler._get_scale_async() if self.scaler.is_enabled() else None
        reading = self.sums.read(
            flags=flags,
            numbers=numbers,
            loss_scale=self.scaler.get_scale() if scale is None else scale,
        )
        limit = self.cfg.max_consecutive_nonfinite
        if reading.longest_nonfinite_run >= limit:
            raise RuntimeError(
                f"{reading.longest_nonfinite_run} consecutive updates with a non-finite loss or gradient "
                f"(--max-consecutive-nonfinite {limit}): stopping (lower --lr, raise --warmup-updates, or use --clip-norm)"
            )
        return reading

    @torch.no_grad()
    def evaluate(self, batches: Iterable[dict[str, Any]]) -> tuple[float, float, int]:
        """(loss sum, nll sum, target tokens) over ``batches``, summed over all ranks (natural
        log); one read of the device at the end."""
        self.model.eval()
        losses = torch.zeros(2, dtype=torch.float64, device=self.device)
        tokens = 0
        for batch in batches:
            loss, nll = self.forward_loss(batch, training=False)
            losses += torch.stack([loss, nll]).double()
            tokens += batch["target_index"].shape[0]
        sums = torch.cat(
            [losses, torch.tensor([float(tokens)], dtype=torch.float64).to(self.device)]
        )
        loss, nll, total = dist.all_reduce_sum(sums).tolist()
        return loss, nll, int(total)

    # ----------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            **self.sums.state_dict(),
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
        self.sums.load_state_dict(state)


class _RealRows(torch.autograd.Function):
    """Rows of ``x`` at distinct indices; the backward writes the gradient into zeros (autograd's
    own backward of a gather is a scatter-add, several times slower on the CPU)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(index)
        ctx.num_rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (index,) = ctx.saved_tensors
        full = grad.new_zeros(ctx.num_rows, *grad.shape[1:])
        full[index] = grad
        return full, None


def real_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(rows, ...) -> (len(index), ...): the real target positions (``index`` from collate, distinct
    and increasing); no operation when every row is real (a packed batch without a static-shape
    tail)."""
    if index.shape[0] == x.shape[0]:  # then index is arange(rows)
        return x
    return _RealRows.apply(x, index)


def bits(nats: float, tokens: int) -> float:
    """A loss sum in nats over ``tokens`` tokens as fairseq reports it: per token, base 2."""
    return nats / max(tokens, 1) / math.log(2)

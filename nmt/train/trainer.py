"""The training loop, readable top to bottom.

One update = ``update_freq`` micro-batches on each of W ranks. The global batch sequence of an epoch
does not depend on W (see ``nmt.data.batching``): each step of W consecutive global batches is dealt
out to the W ranks, so update k covers global batches [k*W*U, (k+1)*W*U) whatever W and U are, as
long as W*U is fixed. Everything random in a micro-batch (dropout) is seeded from (seed, epoch, the
batch's first sample), never from the rank, and the loss is normalised once by the update's
target-token count computed from the *global* batch list, so 2 ranks x U=1 and 1 rank x U=2 take
the same steps.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from nmt import dist
from nmt.checkpoint_io import bytes_to_tensor
from nmt.config import ModelConfig, TrainConfig, to_dict
from nmt.data import ParallelCorpus, load_manifest
from nmt.data.blend import BlendedCorpus, BlendedEpochs, weights_from_temperature
from nmt.data.batching import Batches, MaxTokensBatchSampler
from nmt.data.collate import collate
from nmt.data.packing import partition_microbatches
from nmt.data.spm import BOS_ID, PAD_ID
from nmt.model import build_model
from nmt.model.transformer import packed_masks
from nmt.train import checkpoint as ckpt
from nmt.train.compile import CompiledStep, packed_token_buckets, shape_buckets
from nmt.train.loss import linear_label_smoothed_cross_entropy
from nmt.train.lr import VariableBatchSizeLR, build_scheduler
from nmt.train.parallel import maybe_no_sync, wrap_data_parallel

logger = logging.getLogger(__name__)
STOPPED_BY_SIGNAL = "stopped by signal"

# A validation callback (built by the CLI from nmt.eval, which nmt.train must not import):
# (unwrapped model, device) -> BLEU on the validation set.
BleuValidator = Callable[[torch.nn.Module, torch.device], float]


@dataclass
class TrainState:
    num_updates: int = 0
    epoch: int = 0
    batches_done: int = 0  # this rank's batches consumed in the current epoch
    best: float | None = None
    bad_validations: int = 0  # for --patience
    consecutive_nonfinite: int = 0
    skipped_updates: int = 0


@dataclass
class UpdateStats:
    loss: float
    nll: float
    ntokens: int
    nsentences: int
    grad_norm: float
    lr: float
    padded_tokens: int  # source + target positions, padding included
    real_tokens: int  # source + target tokens
    skipped: bool = False


def micro_seed(seed: int, epoch: int, batch_key: int, part: int) -> int:
    """A dropout seed from the data alone, never from the rank or world size.

    ``batch_key`` is the batch's first sample index: batches of an epoch are disjoint slices of
    one permutation, so it names the batch whichever rank runs it, at whatever position.
    """
    return int(np.random.SeedSequence([seed, epoch, batch_key, part]).generate_state(1, dtype=np.uint64)[0] >> 1)


def read_difficulty(spec: str | None, corpus: ParallelCorpus) -> str | np.ndarray | None:
    """``--curriculum length`` or ``file:PATH`` with one float per raw training line (or per kept pair)."""
    if spec is None or spec == "length":
        return spec
    path = spec[len("file:") :]
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except OSError as error:
        raise ValueError(f"--curriculum: cannot read {path}: {error}") from None
    if lines and lines[-1] == "":
        lines.pop()
    scores = np.empty(len(lines), dtype=np.float64)
    for number, line in enumerate(lines, start=1):
        try:
            scores[number - 1] = float(line)
        except ValueError:
            raise ValueError(f"{path}:{number}: not a number: {line[:40]!r} (--curriculum)") from None
    if not np.isfinite(scores).all():
        raise ValueError(f"{path}:{int(np.flatnonzero(~np.isfinite(scores))[0]) + 1}: score is not finite (--curriculum)")
    num_lines = corpus.entry.num_lines
    if scores.shape[0] == num_lines:
        return scores[np.asarray(corpus.line_numbers)]
    if scores.shape[0] == len(corpus):
        return scores
    raise ValueError(f"{path}: {scores.shape[0]} scores, expected one per training line ({num_lines}) or per kept pair ({len(corpus)})")


def resolve_device(name: str, *, local_rank: int) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is available")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


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
    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig, *, bleu_validator: BleuValidator | None = None) -> None:
        self.cfg = cfg
        self.model_cfg = model_cfg
        self.bleu_validator = bleu_validator
        self.env = dist.init_distributed("cuda" if cfg.run.device != "cpu" and torch.cuda.is_available() else "cpu")
        self.device = resolve_device(cfg.run.device, local_rank=self.env.local_rank)
        self.is_main = self.env.is_main
        self.log_here = self.is_main or cfg.logging.log_all_ranks

        self.manifest = load_manifest(cfg.data.data_dir)
        self.vocab = self.read_vocab()  # once: every checkpoint carries it
        self.train_corpora = [ParallelCorpus(cfg.data.data_dir, name, manifest=self.manifest) for name in cfg.data.train_subsets]
        self.valid_data = (
            ParallelCorpus(cfg.data.data_dir, cfg.data.valid_subset, manifest=self.manifest)
            if cfg.data.valid_subset in self.manifest.splits
            else None
        )
        self.blend = self.make_blend()
        # Padded compiled shapes round every sample; packed ones round the batch total instead.
        self.length_multiple = cfg.data.batching.length_multiple if cfg.run.compile and cfg.data.batching.layout == "padded" else 1
        # A single corpus is the training set for every epoch; a blend replaces both per epoch.
        self.train_data: ParallelCorpus | BlendedCorpus = self.train_corpora[0]
        self.sampler = self.make_sampler(self.train_data)
        self.tgt_lengths = np.asarray(self.train_data.tgt_lengths, dtype=np.int64)

        torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank
        self.model = build_model(model_cfg).to(self.device)
        self.wrapped = wrap_data_parallel(self.model, device=self.device)
        # Fused Adam: one kernel over all parameters instead of ~10 elementwise ops per tensor.
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.adam_betas), eps=cfg.optim.adam_eps,
            weight_decay=cfg.optim.weight_decay, fused=True,
        )
        self.scheduler: VariableBatchSizeLR = build_scheduler(
            self.optimizer,
            name=cfg.optim.lr_scheduler,
            lr=cfg.optim.lr,
            warmup_updates=cfg.optim.warmup_updates,
            warmup_init_lr=cfg.optim.warmup_init_lr,
            max_update=cfg.run.max_update,
            min_lr=cfg.optim.min_lr,
            scaling=cfg.optim.lr_scaling,
            scaling_reference=cfg.optim.lr_scaling_reference,
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.run.fp16)
        self.autocast_dtype = torch.bfloat16 if cfg.run.bf16 else torch.float16 if cfg.run.fp16 else None
        self.state = TrainState()
        self.compiled: CompiledStep | None = None
        self.writer = None
        self.started = time.perf_counter()
        if self.log_here:
            logger.info(
                "rank %d/%d on %s | %d training pairs in %s | model %s: %.2fM parameters | attention backend %s",
                self.env.rank, self.env.world_size, self.device, sum(len(c) for c in self.train_corpora),
                ",".join(cfg.data.train_subsets), cfg.run.arch,
                sum(p.numel() for p in self.model.parameters()) / 1e6, self.model.backend(self.device),
            )

    # ----------------------------------------------------------------------------- data
    def make_blend(self) -> BlendedEpochs | None:
        """Several corpora (or an explicit epoch size): a weighted blend index per epoch."""
        cfg = self.cfg
        if len(self.train_corpora) == 1 and not cfg.data.subset_weights and not cfg.data.epoch_samples:
            return None
        sizes = [len(corpus) for corpus in self.train_corpora]
        if cfg.data.subset_weights:
            weights = list(cfg.data.subset_weights)
        elif cfg.data.sampling_temperature:
            weights = list(weights_from_temperature(sizes, cfg.data.sampling_temperature))
        else:
            weights = [float(size) for size in sizes]
        return BlendedEpochs(
            sizes, weights, cfg.data.epoch_samples or sum(sizes), seed=cfg.run.seed,
            cache_dir=os.path.join(cfg.checkpoint.save_dir, "blend-cache"),
            rank=self.env.rank, world_size=self.env.world_size, barrier=dist.barrier,
        )

    def make_sampler(self, dataset: ParallelCorpus | BlendedCorpus) -> MaxTokensBatchSampler:
        cfg = self.cfg
        return MaxTokensBatchSampler(
            dataset.src_lengths,
            dataset.tgt_lengths,
            cfg.data.batching.max_tokens,
            noise=cfg.data.batching.batch_noise,
            noise_mode=cfg.data.batching.noise_mode,
            seed=cfg.run.seed,
            num_replicas=self.env.world_size,
            rank=self.env.rank,
            curriculum=read_difficulty(cfg.data.curriculum, self.train_corpora[0]),
            max_sentences=cfg.data.batching.max_sentences,
            length_multiple=self.length_multiple,
            packed=cfg.data.batching.layout == "packed",
            curriculum_epochs=cfg.data.batching.curriculum_epochs,
            competence_updates=cfg.data.batching.competence_updates or None,
            competence_initial=cfg.data.batching.competence_initial,
            update_freq=cfg.data.batching.update_freq,
        )

    def prepare_epoch(self, epoch: int) -> None:
        """With a blend, this epoch's samples (the next epoch's are built in the background meanwhile)."""
        if self.blend is None:
            return
        corpus_ids, sample_ids = self.blend.get(epoch)
        self.train_data = BlendedCorpus(self.train_corpora, corpus_ids, sample_ids)
        self.sampler = self.make_sampler(self.train_data)
        self.tgt_lengths = np.asarray(self.train_data.tgt_lengths, dtype=np.int64)
        samples, tokens = self.train_data.per_corpus_counts()
        per_corpus = {}
        for name, num_samples, num_tokens in zip(self.cfg.data.train_subsets, samples, tokens):
            per_corpus[f"{name}_samples"] = int(num_samples)
            per_corpus[f"{name}_tokens"] = int(num_tokens)
        self.log_metrics(per_corpus, prefix="blend")

    # ----------------------------------------------------------------------------- checkpoints
    def read_vocab(self) -> dict[str, Any]:
        """What a checkpoint needs to translate raw text on its own: languages, ids, SentencePiece models."""
        vocab: dict[str, Any] = {
            "source_lang": self.manifest.source_lang,
            "target_lang": self.manifest.target_lang,
            "special_ids": dict(self.manifest.special_ids),
        }
        for side in ("src", "tgt"):
            with open(self.manifest.path(getattr(self.manifest.spm, f"{side}_model")), "rb") as handle:
                vocab[f"{side}_spm"] = bytes_to_tensor(handle.read())
        return vocab

    def checkpoint_state(self) -> dict[str, Any]:
        return ckpt.make_checkpoint(
            model=self.model.state_dict(),
            model_config=to_dict(self.model_cfg),
            vocab=self.vocab,
            train_config=to_dict(self.cfg),
            optimizer=self.optimizer.state_dict(),
            lr_scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            sampler=self.sampler.state_dict(consumed=self.state.batches_done),
            rng=ckpt.rng_state(),
            num_updates=self.state.num_updates,
            epoch=self.state.epoch,
            best=self.state.best,
            bad_validations=self.state.bad_validations,
            skipped_updates=self.state.skipped_updates,
        )

    def save(self, *, end_of_epoch: bool, is_best: bool = False) -> None:
        if self.is_main:
            names = [ckpt.LAST]
            numbered = (end_of_epoch and not self.cfg.checkpoint.no_epoch_checkpoints) or (
                not end_of_epoch and self.cfg.checkpoint.save_interval_updates > 0
            )
            if numbered:
                names.insert(0, ckpt.numbered_name(epoch=self.state.epoch, num_updates=self.state.num_updates, end_of_epoch=end_of_epoch))
            if is_best:
                names.append(ckpt.BEST)
            started = time.perf_counter()
            ckpt.save(self.checkpoint_state(), self.cfg.checkpoint.save_dir, names)
            ckpt.rotate(self.cfg.checkpoint.save_dir, keep_last=self.cfg.checkpoint.keep_last)
            logger.info("saved %s at update %d (%.2fs)", ", ".join(names), self.state.num_updates, time.perf_counter() - started)
        dist.barrier()

    def try_resume(self) -> bool:
        state = ckpt.find_resume_checkpoint(self.cfg.checkpoint.save_dir)
        if state is None:
            return False
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["lr_scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        ckpt.set_rng_state(state["rng"])
        self.state = TrainState(
            num_updates=int(state["num_updates"]),
            epoch=int(state["epoch"]),
            batches_done=int(state["sampler"]["position"]),
            best=state["best"],
            bad_validations=int(state["bad_validations"]),
            skipped_updates=int(state["skipped_updates"]),
        )
        if self.log_here:
            logger.info("resumed from %s: epoch %d, update %d, batch %d of the epoch",
                        os.path.join(self.cfg.checkpoint.save_dir, ckpt.LAST), self.state.epoch, self.state.num_updates, self.state.batches_done)
        return True

    # ----------------------------------------------------------------------------- one update
    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def make_batch(self, indices: np.ndarray) -> dict[str, Any]:
        """Collated tensors for these samples; a dummy (empty) batch gets sample 0, at zero weight."""
        indices = indices if indices.size else np.zeros(1, dtype=np.int64)
        samples = [self.train_data[int(i)] for i in indices]
        if self.compiled is not None:
            return self.compiled.collate(samples)
        return collate(samples, pad_id=PAD_ID, bos_id=BOS_ID, layout=self.cfg.data.batching.layout)

    def forward_loss(self, model: torch.nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss sum, nll sum) over the real target tokens of one micro-batch."""
        extra: dict[str, Any] = {}
        if self.cfg.data.batching.layout == "packed":
            # Built here, eager: a compiled model sees token counts only, never the per-sample sizes.
            masks = packed_masks(
                self.model.backend(self.device), batch["src_lengths"], batch["tgt_lengths"],
                num_src=batch["src_tokens"].shape[0], num_tgt=batch["prev_output_tokens"].shape[0],
                src_cu_seqlens=batch["src_cu_seqlens"], tgt_cu_seqlens=batch["tgt_cu_seqlens"],
            )
            extra = dict(packed=True, src_positions=batch["src_positions"], tgt_positions=batch["tgt_positions"], masks=masks)
        autocast = (
            torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype else contextlib.nullcontext()
        )
        with autocast:
            # With masks, a packed forward needs no lengths (and must not get them: see above).
            src_lengths, tgt_lengths = (None, None) if extra else (batch["src_lengths"], batch["tgt_lengths"])
            hidden = model(batch["src_tokens"], src_lengths, batch["prev_output_tokens"], tgt_lengths, **extra)
            target = batch["target"]
        real = target != PAD_ID  # project only real positions: the 8k-way output is the costliest op
        return linear_label_smoothed_cross_entropy(
            hidden[real], self.model.output_projection.weight, target[real], epsilon=self.cfg.optim.label_smoothing
        )

    def split_microbatches(self, indices: np.ndarray) -> list[np.ndarray]:
        """--max-tokens-per-microbatch: balanced parts under the cap, the count agreed over ranks."""
        cap = self.cfg.data.batching.max_tokens_per_microbatch
        if cap is None:
            return [indices]
        # Called for dummy (empty) batches too: the count is agreed by a collective inside.
        lengths = np.maximum(self.train_data.src_lengths[indices], self.train_data.tgt_lengths[indices]).astype(np.int64)
        parts = partition_microbatches(lengths, cap)
        return [indices[np.asarray(p, dtype=np.int64)] for p in parts]

    def batch_stream(self, rank_batches: Batches, *, start: int) -> Iterator[dict[str, Any] | None]:
        """This rank's batches from ``start`` on, collated ahead by --num-workers processes (or here).

        With --max-tokens-per-microbatch the parts are collated in ``run_update`` instead (their
        count is agreed across ranks there), so this yields None.
        """
        if self.cfg.data.batching.max_tokens_per_microbatch is not None:
            return itertools.repeat(None)
        remaining = [rank_batches[i] for i in range(start, len(rank_batches))]
        if self.cfg.data.num_workers == 0:
            return map(self.make_batch, remaining)
        return iter(
            torch.utils.data.DataLoader(
                _CollatedBatches(remaining, self.make_batch), batch_size=None, num_workers=self.cfg.data.num_workers,
                prefetch_factor=4,
            )
        )

    def run_update(
        self,
        micro_batches: list[tuple[int, np.ndarray]],
        *,
        update_tokens: int,
        update_sentences: int,
        collated: list[dict[str, Any] | None] | None = None,
    ) -> UpdateStats:
        """Forward/backward every (batch key, sample indices) pair of this rank, then step.

        ``collated``: the same batches already collated (by ``batch_stream``), else collated here.
        """
        cfg, world = self.cfg, self.env.world_size
        self.wrapped.train()
        sums = torch.zeros(4, dtype=torch.float64)  # loss, nll, padded tokens, real tokens
        collated = collated or [None] * len(micro_batches)
        work: list[tuple[int, int, np.ndarray, dict[str, Any] | None]] = []
        for (batch_key, indices), ready in zip(micro_batches, collated):
            parts = self.split_microbatches(indices)
            for part_index, part in enumerate(parts):
                work.append((batch_key, part_index, part, ready if len(parts) == 1 else None))
        # The gradient of sum(loss) / update_tokens: DDP averages over ranks, hence the factor W.
        scale = world / max(update_tokens, 1)
        for position, (batch_key, part_index, indices, ready) in enumerate(work):
            dummy = indices.size == 0
            batch = self.to_device(ready if ready is not None else self.make_batch(indices))
            torch.manual_seed(micro_seed(cfg.run.seed, self.state.epoch, batch_key, part_index))
            with maybe_no_sync(self.wrapped, sync=position == len(work) - 1):
                loss, nll = self.forward_loss(self.compiled.model if self.compiled else self.wrapped, batch)
                weight = 0.0 if dummy else scale  # dummy batches keep DDP in step but carry no gradient
                self.scaler.scale(loss * weight).backward()
            if not dummy:
                padded = batch["src_tokens"].numel() + batch["target"].numel()
                real = batch["src_lengths"].sum() + batch["tgt_lengths"].sum()
                sums += torch.tensor([loss.item(), nll.item(), float(padded), float(real)], dtype=torch.float64)
        dist.all_reduce_sum(sums)

        batch_size = update_sentences if cfg.optim.lr_scaling_by == "sentences" else update_tokens
        lr = self.scheduler.step(batch_size)[0]
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if cfg.optim.clip_norm > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.optim.clip_norm))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
        skipped = False
        if cfg.run.fp16:
            scale_before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < scale_before  # overflow: step skipped, scale lowered
        elif math.isfinite(grad_norm) and math.isfinite(float(sums[0])):
            self.optimizer.step()
            self.state.consecutive_nonfinite = 0
        else:
            skipped = True
            self.state.consecutive_nonfinite += 1
            self.state.skipped_updates += 1
            logger.warning("update %d: non-finite loss or gradient (grad norm %s): update skipped (%d in a row)",
                           self.state.num_updates + 1, grad_norm, self.state.consecutive_nonfinite)
            if self.state.consecutive_nonfinite >= cfg.optim.max_consecutive_nonfinite:
                raise RuntimeError(
                    f"{self.state.consecutive_nonfinite} consecutive updates with a non-finite loss or gradient: "
                    "stopping (lower --lr, raise --warmup-updates, or use --clip-norm)"
                )
        self.optimizer.zero_grad(set_to_none=True)
        tokens = max(update_tokens, 1)
        return UpdateStats(
            loss=float(sums[0]) / tokens / math.log(2),
            nll=float(sums[1]) / tokens / math.log(2),
            ntokens=update_tokens,
            nsentences=update_sentences,
            grad_norm=grad_norm,
            lr=lr,
            padded_tokens=int(sums[2]),
            real_tokens=int(sums[3]),
            skipped=skipped,
        )

    # ----------------------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        if self.valid_data is None:
            return {}
        self.wrapped.eval()
        sampler = MaxTokensBatchSampler(
            self.valid_data.src_lengths, self.valid_data.tgt_lengths, self.cfg.data.batching.max_tokens,
            noise=0.0, shuffle=False, num_replicas=self.env.world_size, rank=self.env.rank,
            packed=self.cfg.data.batching.layout == "packed",
        )
        sums = torch.zeros(3, dtype=torch.float64)
        for indices in sampler:
            if not indices:
                continue
            samples = [self.valid_data[i] for i in indices]
            batch = self.to_device(collate(samples, pad_id=PAD_ID, bos_id=BOS_ID, layout=self.cfg.data.batching.layout))
            loss, nll = self.forward_loss(self.model, batch)
            sums += torch.tensor([loss.item(), nll.item(), float((batch["target"] != PAD_ID).sum())], dtype=torch.float64)
        dist.all_reduce_sum(sums)
        tokens = max(float(sums[2]), 1.0)
        metrics = {"valid_loss": float(sums[0]) / tokens / math.log(2), "valid_nll": float(sums[1]) / tokens / math.log(2)}
        metrics["valid_ppl"] = 2 ** metrics["valid_nll"]
        if self.bleu_validator is not None:
            bleu = self.bleu_validator(self.model, self.device) if self.is_main else 0.0
            metrics["valid_bleu"] = float(dist.broadcast_object(bleu))
        return metrics

    def record_validation(self, metrics: dict[str, float]) -> tuple[bool, bool]:
        """(is this the best model so far, should --patience stop training)."""
        if not metrics:
            return False, False
        self.log_metrics(metrics, prefix="valid")
        bleu_metric = self.cfg.checkpoint.best_checkpoint_metric == "bleu"
        value = metrics["valid_bleu"] if bleu_metric else metrics["valid_loss"]
        improved = self.state.best is None or (value > self.state.best if bleu_metric else value < self.state.best)
        if improved:
            self.state.best = value
            self.state.bad_validations = 0
        else:
            self.state.bad_validations += 1
        return improved, 0 <= self.cfg.checkpoint.patience < self.state.bad_validations

    # ----------------------------------------------------------------------------- logging
    def log_metrics(self, values: dict[str, Any], *, prefix: str) -> None:
        if not self.log_here:
            return
        record = {"update": self.state.num_updates, "epoch": self.state.epoch + 1, **values}
        if self.cfg.logging.log_format == "json":
            print(json.dumps({"kind": prefix, **record}), flush=True)
        else:
            text = " | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())
            logger.info("%s | %s", prefix, text)
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self.writer.add_scalar(f"{prefix}/{key}", value, self.state.num_updates)

    # ----------------------------------------------------------------------------- the loop
    def update_batches(self, global_batches: Batches, rank_batches: Batches, update_index: int) -> tuple[list[tuple[int, np.ndarray]], int, int]:
        """This rank's (batch key, indices) for update ``update_index``, and the update's global token/sentence counts."""
        cfg, world = self.cfg, self.env.world_size
        per_update = world * cfg.data.batching.update_freq
        first, last = update_index * per_update, min((update_index + 1) * per_update, len(global_batches))
        global_indices = np.concatenate([global_batches[g] for g in range(first, last)]) if last > first else np.zeros(0, dtype=np.int64)
        update_tokens = int(self.tgt_lengths[global_indices].sum())
        local = []
        for u in range(cfg.data.batching.update_freq):
            local_index = update_index * cfg.data.batching.update_freq + u
            if local_index < len(rank_batches):
                indices = rank_batches[local_index]
                local.append((int(indices[0]) if indices.size else 0, indices))  # a dummy's seed is moot: zero weight
        return local, update_tokens, int(global_indices.size)

    def train(self) -> TrainState:
        cfg = self.cfg
        self.try_resume()
        if cfg.run.compile and cfg.data.batching.layout == "packed":
            shapes = [(1, tokens) for tokens in packed_token_buckets(max_tokens=cfg.data.batching.max_tokens, length_multiple=cfg.data.batching.length_multiple)]
            self.compiled = CompiledStep.build(self, shapes)
        elif cfg.run.compile:
            self.compiled = CompiledStep.build(self, shape_buckets(
                np.concatenate([c.src_lengths for c in self.train_corpora]),
                np.concatenate([c.tgt_lengths for c in self.train_corpora]),
                max_tokens=cfg.data.batching.max_tokens, length_multiple=cfg.data.batching.length_multiple, max_sentences=cfg.data.batching.max_sentences))
        if self.is_main and cfg.logging.tensorboard_logdir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(cfg.logging.tensorboard_logdir)
        stop_reason = None
        with StopSignal() as stop_signal:
            while stop_reason is None:
                if cfg.run.max_epoch and self.state.epoch >= cfg.run.max_epoch:
                    stop_reason = f"--max-epoch {cfg.run.max_epoch} reached"
                    break
                stop_reason = self.train_epoch(stop_signal)
                if stop_reason is None:
                    self.state.epoch += 1
                    self.state.batches_done = 0
                    is_best, patience_stop = self.record_validation(self.validate())
                    self.save(end_of_epoch=True, is_best=is_best)
                    if patience_stop:
                        stop_reason = f"no improvement in {cfg.checkpoint.patience + 1} validations (--patience {cfg.checkpoint.patience})"
        if self.log_here:
            logger.info("done: %s (%d updates, %.1f min)", stop_reason, self.state.num_updates, (time.perf_counter() - self.started) / 60)
        if self.writer is not None:
            self.writer.close()
        if self.blend is not None:
            self.blend.close()
        return self.state

    def train_epoch(self, stop_signal: StopSignal) -> str | None:
        """Run the rest of the current epoch; a stop reason, or None when the epoch ended."""
        cfg = self.cfg
        epoch_start_update = self.state.num_updates - self.state.batches_done // cfg.data.batching.update_freq
        self.prepare_epoch(self.state.epoch)
        self.sampler.set_epoch(self.state.epoch, start_update=epoch_start_update)
        global_batches = self.sampler.global_batches()
        rank_batches = self.sampler.rank_batches()
        num_updates_in_epoch = -(-len(rank_batches) // cfg.data.batching.update_freq)
        first_update = self.state.batches_done // cfg.data.batching.update_freq
        progress = tqdm(
            total=num_updates_in_epoch, initial=first_update, desc=f"epoch {self.state.epoch + 1}", unit="upd",
            disable=not self.is_main, dynamic_ncols=True, mininterval=2.0, leave=False,
        )
        window = {"tokens": 0, "padded": 0, "real": 0, "time": time.perf_counter()}
        batches = self.batch_stream(rank_batches, start=first_update * cfg.data.batching.update_freq)
        for update_index in range(first_update, num_updates_in_epoch):
            micro, update_tokens, update_sentences = self.update_batches(global_batches, rank_batches, update_index)
            collated = [next(batches) for _ in micro]
            stats = self.run_update(micro, update_tokens=update_tokens, update_sentences=update_sentences, collated=collated)
            self.state.num_updates += 1
            self.state.batches_done = min((update_index + 1) * cfg.data.batching.update_freq, len(rank_batches))
            progress.update(1)
            window["tokens"] += stats.ntokens
            window["padded"] += stats.padded_tokens
            window["real"] += stats.real_tokens
            if self.state.num_updates % cfg.logging.log_interval == 0:
                elapsed = max(time.perf_counter() - window["time"], 1e-9)
                values = {
                    "loss": stats.loss, "nll": stats.nll, "ppl": 2 ** stats.nll, "lr": stats.lr,
                    "ntokens": stats.ntokens, "nsentences": stats.nsentences, "wps": window["tokens"] / elapsed,
                    "gnorm": stats.grad_norm, "padding_ratio": 1.0 - window["real"] / max(window["padded"], 1),
                    "loss_scale": self.scaler.get_scale() if cfg.run.fp16 else 1.0, "skipped": self.state.skipped_updates,
                }
                self.log_metrics(values, prefix="train")
                progress.set_postfix(loss=f"{stats.loss:.3f}", wps=f"{values['wps']:.0f}")
                window = {"tokens": 0, "padded": 0, "real": 0, "time": time.perf_counter()}

            reason = self.stop_reason_after_update(stop_signal)
            at_end = update_index == num_updates_in_epoch - 1  # the epoch end validates and saves anyway
            is_best = False
            interval_validation = (
                cfg.checkpoint.validate_interval_updates and self.state.num_updates % cfg.checkpoint.validate_interval_updates == 0 and not at_end
            )
            # A run that ends here (--max-update, --stop-time-hours) validates its last update, as
            # fairseq does: checkpoint_best.pt then exists however short the run. A signal stops
            # without that wait.
            final_validation = reason is not None and reason != STOPPED_BY_SIGNAL
            if interval_validation or final_validation:
                is_best, patience_stop = self.record_validation(self.validate())
                if patience_stop:
                    reason = reason or f"no improvement in {cfg.checkpoint.patience + 1} validations (--patience {cfg.checkpoint.patience})"
            interval_save = cfg.checkpoint.save_interval_updates and self.state.num_updates % cfg.checkpoint.save_interval_updates == 0 and not at_end
            if reason or is_best or interval_save:
                self.save(end_of_epoch=False, is_best=is_best)
            if reason:
                progress.close()
                return reason
        progress.close()
        return None

    def stop_reason_after_update(self, stop_signal: StopSignal) -> str | None:
        cfg = self.cfg
        out_of_time = cfg.run.stop_time_hours > 0 and time.perf_counter() - self.started > cfg.run.stop_time_hours * 3600
        # Every rank must stop at the same update: agree on signals and the clock.
        flags = dist.all_reduce_max(torch.tensor([int(stop_signal.requested), int(out_of_time)], dtype=torch.int64))
        if flags[0]:
            return STOPPED_BY_SIGNAL
        if flags[1]:
            return f"--stop-time-hours {cfg.run.stop_time_hours} reached"
        if cfg.run.max_update and self.state.num_updates >= cfg.run.max_update:
            return f"--max-update {cfg.run.max_update} reached"
        return None


class _CollatedBatches(torch.utils.data.Dataset):
    """A rank's batches for the rest of an epoch, in order, collated where the DataLoader runs it."""

    def __init__(self, batches: list[np.ndarray], make_batch: Callable[[np.ndarray], dict[str, Any]]) -> None:
        self.batches = batches
        self.make_batch = make_batch

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.make_batch(self.batches[index])

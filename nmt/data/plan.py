"""The training-data plan: every data decision of a run, owned in one place.

Built from one ``DataConfig`` (with its ``BatchingConfig``), the run's seed and this rank's place,
the plan owns the corpora, the blend of an epoch, the difficulty of every sample (aligned to
samples, never to blend slots), the global batch sequence, this rank's share of it, micro-batch
splitting, the static shapes of ``--compile`` and its own resumable position. The trainer only asks
for the next update::

    plan = TrainingDataPlan(cfg.data, seed=1, rank=r, world_size=w)
    while ...:
        info = plan.begin_epoch()          # info.epoch: 1-based, as users count epochs
        for update in plan.updates():      # this rank's collated micro-batches + the global counts
            ...
        plan.end_epoch()
    plan.state_dict() / plan.load_state_dict(state)   # exact resume

Update k of an epoch covers global batches [k W U, (k+1) W U) whatever the world size W and the
accumulation U (``nmt.data.batching``); its token count is summed over those global batches, so
the loss is normalised once by the same number on every rank. Dropout seeds come from (seed,
epoch, the batch's first sample, part), never from the rank.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nmt import dist
from nmt.config import DataConfig
from nmt.data.batching import Batches, batch_tokens, global_batches, shard
from nmt.data.blend import BlendedCorpus, BlendedEpochs, weights_from_temperature
from nmt.data.collate import collate
from nmt.data.corpus import ParallelCorpus
from nmt.data.difficulty import DifficultyScorer, corpus_difficulty
from nmt.data.directions import TaggedCorpus, open_directions
from nmt.data.manifest import Manifest, load_manifest, verify_checksums
from nmt.data.packing import partition_microbatches
from nmt.data.shapes import StaticShapes
from nmt.data.spm import BOS_ID, PAD_ID
from nmt.data.terminology import MAX_ADDED_TOKENS, TermAnnotatedCorpus, TermAnnotation

logger = logging.getLogger(__name__)

# Batches collated ahead of the update that trains on them (without --num-workers): a few hide a
# slow one (a batch of many short samples) and hold a few MB.
PREFETCH_BATCHES = 4


@dataclass
class MicroBatch:
    indices: np.ndarray  # samples of the epoch's dataset (sorted within a split batch)
    batch: dict[str, torch.Tensor]  # collated, on the CPU
    seed: int  # dropout seed
    dummy: bool  # keeps ranks in step at an epoch's end, or an empty part of a split: zero weight
    real_tokens: int  # source + target tokens (0 for a dummy)
    padded_tokens: int  # source + target positions of the collated tensors, padding included


@dataclass
class Update:
    micro_batches: list[MicroBatch]  # this rank's
    num_tokens: int  # target tokens of the whole update, all ranks: the loss normaliser
    num_sentences: int  # sentences of the whole update, all ranks
    epoch: int  # 1-based
    ends_epoch: bool  # the last update of its epoch


@dataclass
class EpochInfo:
    epoch: int  # 1-based
    num_updates: int  # updates in the epoch
    first_update: int  # > 0 when resuming inside the epoch
    blend_counts: dict[str, int]  # samples and tokens per corpus (blends only)


@dataclass
class EpochBatches:
    dataset: ParallelCorpus | BlendedCorpus | TermAnnotatedCorpus
    difficulty: np.ndarray | None  # (len(dataset),) per sample of the epoch's dataset
    rank_batches: Batches
    update_tokens: np.ndarray  # (num_updates,) global target tokens per update
    update_sentences: np.ndarray  # (num_updates,)

    @property
    def num_updates(self) -> int:
        return int(self.update_tokens.shape[0])


def micro_seed(seed: int, epoch: int, batch_key: int, part: int) -> int:
    """A dropout seed from the data alone, never from the rank or world size.

    ``batch_key`` is the batch's first sample index: batches of an epoch are disjoint slices of
    one permutation, so it names the batch whichever rank runs it, at whatever position.
    """
    return int(
        np.random.SeedSequence([seed, epoch, batch_key, part]).generate_state(1, dtype=np.uint64)[0]
        >> 1
    )


def segment_sums(values: np.ndarray, *, group: int) -> np.ndarray:
    """Sums of consecutive groups of ``group`` values (the last one may be short)."""
    if values.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.add.reduceat(values.astype(np.int64), np.arange(0, values.shape[0], group))


def truncate(tokens: np.ndarray, limit: int) -> np.ndarray:
    """At most ``limit`` tokens, the final EOS kept."""
    return (
        tokens if tokens.shape[0] <= limit else np.concatenate([tokens[: limit - 1], tokens[-1:]])
    )


def verify_dataset(manifest: Manifest, *, rank: int) -> None:
    """--verify-data: every byte of the dataset against its SHA-256; rank 0 reads, every rank stops."""
    problem = None
    if rank == 0:
        try:
            verify_checksums(manifest)
        except ValueError as error:
            problem = str(error)
    problem = dist.broadcast_object(problem)
    if problem is not None:
        raise ValueError(f"--verify-data: {problem}")


class TrainingDataPlan:
    def __init__(
        self,
        cfg: DataConfig,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        static_shapes: bool = False,
        max_positions: tuple[int, int] | None = None,
        cache_dir: str | None = None,
        manifest: Manifest | None = None,
        scorer: DifficultyScorer | None = None,
    ) -> None:
        self.cfg = cfg
        self.batching = cfg.batching
        self.seed = seed
        self.rank, self.world_size = rank, world_size
        self.max_positions = max_positions
        self.manifest = load_manifest(cfg.data_dir) if manifest is None else manifest
        for option, asked, has in (
            ("--source-lang", cfg.source_lang, self.manifest.source_lang),
            ("--target-lang", cfg.target_lang, self.manifest.target_lang),
        ):
            if asked is not None and asked != has:
                raise ValueError(
                    f"{option} {asked}: {cfg.data_dir} holds {self.manifest.source_lang}-{self.manifest.target_lang} data"
                )
        if cfg.verify_data:
            verify_dataset(self.manifest, rank=rank)
        # The corpora blended, by name: every direction of each training split (``train.en-de``...,
        # or ``train`` on a dataset of one untagged direction), its tag in place.
        languages = self.manifest.languages(cfg.lang_tok)
        if cfg.subset_weights and len(languages.pairs) > 1:
            raise ValueError(
                "--subset-weights: a multilingual dataset blends its directions by size, "
                "or by --sampling-temperature"
            )
        unknown = [pair for pair in cfg.direction_factors if pair not in languages.pairs]
        if unknown:
            raise ValueError(
                f"--upsample-directions {unknown[0]}: {cfg.data_dir} has no such direction "
                f"(has: {', '.join(languages.pairs)})"
            )
        directions = [
            open_directions(self.manifest, name, placement=cfg.lang_tok)
            for name in cfg.train_subsets
        ]
        missing = [name for name, found in zip(cfg.train_subsets, directions) if not found]
        if missing:
            raise ValueError(
                f"--train-subsets {missing[0]}: {cfg.data_dir} has no such split in any direction "
                f"(has: {', '.join(self.manifest.splits)})"
            )
        self.corpus_names = self.manifest.training_splits(cfg.train_subsets)
        self.corpus_pairs = [pair for found in directions for pair in found]
        self.corpora: list[ParallelCorpus | TaggedCorpus] = [
            corpus for found in directions for corpus in found.values()
        ]
        # Validation sets by direction; empty without a validation split.
        self.valid_sets: dict[str, ParallelCorpus | TaggedCorpus] = open_directions(
            self.manifest, cfg.valid_subset, placement=cfg.lang_tok
        )
        for name, valid in self.valid_sets.items():
            if len(valid) == 0:
                raise ValueError(
                    f"{cfg.data_dir}: the validation split {cfg.valid_subset!r}{self._of(name)} "
                    "has no pairs: every score on it would be 0 (preprocess with a --validpref that has "
                    "lines, or without one)"
                )
        self._check_positions()
        self._report_long_valid_pairs()
        # --term-annotation-rate: training sources only (validation measures plain input).
        self.terms = (
            TermAnnotation.for_dataset(
                self.manifest, cfg.term_annotation_rate, mask_rate=cfg.term_mask_rate
            )
            if cfg.term_annotation_rate
            else None
        )
        # Padded static shapes round every sample up; packed ones round the batch total instead.
        self.length_multiple = (
            self.batching.length_multiple if static_shapes and not self.batching.packed else 1
        )
        self.static = (
            StaticShapes.for_data(
                self.longest + (MAX_ADDED_TOKENS if self.terms is not None else 0),
                max_tokens=self.batching.max_tokens,
                length_multiple=self.batching.length_multiple,
                max_sentences=self.batching.max_sentences,
                packed=self.batching.packed,
            )
            if static_shapes
            else None
        )
        self.difficulty = corpus_difficulty(
            cfg,
            self.corpora,
            scorer=scorer,
            rank=rank,
            world_size=world_size,
            cache_dir=cache_dir,
        )
        self.blend = self._make_blend(cache_dir)
        # The position: what a checkpoint saves. Epochs are 1-based, as users count them; the
        # 0-based index seeds the epoch's batches and blend.
        self.epoch = 1
        self.epoch_start_update = 0  # updates done before this epoch (competence schedules by it)
        self.updates_done = 0  # updates of this epoch already handed out
        self._current: EpochBatches | None = None

    # ----------------------------------------------------------------------------- set-up
    @property
    def epoch_index(self) -> int:
        """The 0-based epoch: what seeds its batches, blend and dropout."""
        return self.epoch - 1

    @property
    def num_samples(self) -> int:
        return sum(len(corpus) for corpus in self.corpora)

    @property
    def longest(self) -> int:
        return max(
            int(max(np.max(c.src_lengths, initial=1), np.max(c.tgt_lengths, initial=1)))
            for c in self.corpora
        )

    def _check_positions(self) -> None:
        """A training sample longer than the model's positions would fail mid-epoch: say it now."""
        if self.max_positions is None:
            return
        for side, option, limit in (
            ("src", "--max-source-positions", self.max_positions[0]),
            ("tgt", "--max-target-positions", self.max_positions[1]),
        ):
            longest = max(
                int(np.max(getattr(c, f"{side}_lengths"), initial=0)) for c in self.corpora
            )
            if longest > limit:
                raise ValueError(
                    f"{option} {limit}: the training data has samples of {longest} tokens; "
                    f"preprocess with --max-len {limit} or raise {option}"
                )

    def _make_blend(self, cache_dir: str | None) -> BlendedEpochs | None:
        cfg = self.cfg
        if not cfg.blended and len(self.corpora) == 1:
            return None
        sizes = [len(corpus) for corpus in self.corpora]
        if cfg.subset_weights:
            weights = list(cfg.subset_weights)
        elif cfg.sampling_temperature:
            weights = list(weights_from_temperature(sizes, cfg.sampling_temperature))
        else:
            weights = [float(size) for size in sizes]
        if cfg.direction_factors:
            weights = [
                w * cfg.direction_factors.get(pair, 1.0)
                for w, pair in zip(weights, self.corpus_pairs)
            ]
        return BlendedEpochs(
            sizes,
            weights,
            cfg.epoch_samples or sum(sizes),
            seed=self.seed,
            cache_dir=None if cache_dir is None else os.path.join(cache_dir, "blend-cache"),
            rank=self.rank,
            world_size=self.world_size,
            barrier=dist.barrier,
        )

    # ----------------------------------------------------------------------------- one epoch
    def _prepare(self) -> EpochBatches:
        if self.blend is None:
            dataset: ParallelCorpus | BlendedCorpus | TermAnnotatedCorpus = self.corpora[0]
            difficulty = self.difficulty
        else:
            dataset = BlendedCorpus(self.corpora, *self.blend.get(self.epoch_index))
            difficulty = None if self.difficulty is None else self.difficulty[dataset.flat_ids]
        if self.terms is not None:
            dataset = self.terms.corpus(
                dataset,
                seed=self.seed,
                epoch=self.epoch_index,
                max_source_len=None if self.max_positions is None else self.max_positions[0],
            )
        src, tgt = np.asarray(dataset.src_lengths), np.asarray(dataset.tgt_lengths)
        per_update = self.world_size * self.batching.update_freq
        batches = global_batches(
            src,
            tgt,
            self.batching,
            seed=self.seed,
            epoch=self.epoch_index,
            difficulty=difficulty,
            start_update=self.epoch_start_update,
            batches_per_update=per_update,
            length_multiple=self.length_multiple,
        )
        tgt_per_batch = batch_tokens(batches, tgt.astype(np.int64))
        return EpochBatches(
            dataset=dataset,
            difficulty=difficulty,
            rank_batches=shard(
                batches, num_replicas=self.world_size, rank=self.rank, sample_tokens=src + tgt
            ),
            update_tokens=segment_sums(tgt_per_batch, group=per_update),
            update_sentences=segment_sums(batches.sizes, group=per_update),
        )

    @property
    def current(self) -> EpochBatches:
        """The current epoch's dataset and this rank's batches (prepared on first use)."""
        if self._current is None:
            self._current = self._prepare()
        return self._current

    def begin_epoch(self) -> EpochInfo:
        """Prepare the current epoch (the next blend is then built in the background)."""
        epoch = self.current
        counts: dict[str, int] = {}
        blend = (
            epoch.dataset.corpus
            if isinstance(epoch.dataset, TermAnnotatedCorpus)
            else epoch.dataset
        )
        if isinstance(blend, BlendedCorpus):
            samples, tokens = blend.per_corpus_counts()
            for name, num_samples, num_tokens in zip(self.corpus_names, samples, tokens):
                counts[f"{name}_samples"], counts[f"{name}_tokens"] = (
                    int(num_samples),
                    int(num_tokens),
                )
        return EpochInfo(self.epoch, epoch.num_updates, self.updates_done, counts)

    def updates(self) -> Iterator[Update]:
        """The rest of the current epoch, update by update, from the saved position. The caller
        ends the epoch (``end_epoch``) once it has handled the update that ``ends_epoch``, before
        saving: a checkpoint then resumes at the next epoch's start."""
        epoch = self.current
        per_rank = self.batching.update_freq
        batches = epoch.rank_batches
        collated = self._collated(epoch, start=self.updates_done * per_rank)
        for k in range(self.updates_done, epoch.num_updates):
            micro = []
            for position in range(k * per_rank, min((k + 1) * per_rank, len(batches))):
                micro.extend(self.micro_batches(batches[position], ready=next(collated)))
            self.updates_done = k + 1  # before the yield: a save after this update resumes after it
            yield Update(
                micro,
                num_tokens=int(epoch.update_tokens[k]),
                num_sentences=int(epoch.update_sentences[k]),
                epoch=self.epoch,
                ends_epoch=self.updates_done == epoch.num_updates,
            )

    def end_epoch(self) -> None:
        assert self._current is not None and self.updates_done == self._current.num_updates, (
            "epoch not finished"
        )
        self.epoch_start_update += self._current.num_updates
        self.epoch += 1
        self.updates_done = 0
        self._current = None

    def _collated(
        self, epoch: EpochBatches, *, start: int
    ) -> Iterator[dict[str, torch.Tensor] | None]:
        """This rank's batches from ``start`` on, collated ahead by --num-workers processes (or by
        a thread of this one: ``made_ahead``).

        With --max-tokens-per-microbatch the parts are collated in ``micro_batches`` instead (their
        number is agreed across ranks there, by a collective), so this yields None.
        """
        if self.batching.max_tokens_per_microbatch is not None:
            return itertools.repeat(None)
        remaining = [epoch.rank_batches[i] for i in range(start, len(epoch.rank_batches))]
        make = _BatchMaker(epoch.dataset, self)
        if self.cfg.num_workers == 0:
            return made_ahead(make, remaining, ahead=PREFETCH_BATCHES)
        return iter(
            torch.utils.data.DataLoader(
                _Batches(remaining, make),
                batch_size=None,
                num_workers=self.cfg.num_workers,
                prefetch_factor=4,
            )
        )

    def micro_batches(
        self, indices: np.ndarray, *, ready: dict[str, torch.Tensor] | None = None
    ) -> list[MicroBatch]:
        """One batch of the current epoch's dataset as micro-batches (split under
        --max-tokens-per-microbatch); ``ready``: the batch already collated (unsplit)."""
        dataset = self.current.dataset
        key = int(indices[0]) if indices.size else 0  # a dummy's seed is moot: zero weight
        parts = (
            [indices]
            if self.batching.max_tokens_per_microbatch is None
            else self._split(dataset, indices)
        )
        make = _BatchMaker(dataset, self)
        micro = []
        for part_index, part in enumerate(parts):
            batch = ready if ready is not None else make(part)
            micro.append(
                MicroBatch(
                    indices=part,
                    batch=batch,
                    seed=micro_seed(self.seed, self.epoch_index, key, part_index),
                    dummy=part.size == 0,
                    # The collated lengths, not the dataset's: a term-annotated source is
                    # batched by its bound (room for the terms) but holds only what was drawn.
                    real_tokens=int(
                        batch["src_lengths"].numpy().sum() + batch["tgt_lengths"].numpy().sum()
                    ),
                    padded_tokens=batch["src_tokens"].numel() + batch["target"].numel(),
                )
            )
        return micro

    def _split(
        self, dataset: ParallelCorpus | BlendedCorpus, indices: np.ndarray
    ) -> list[np.ndarray]:
        """--max-tokens-per-microbatch: balanced parts under the cap; every rank makes as many
        (called for dummy batches too: the count is agreed by a collective inside)."""
        src, tgt = np.asarray(dataset.src_lengths), np.asarray(dataset.tgt_lengths)
        lengths = np.maximum(src[indices], tgt[indices]).astype(np.int64)
        return [
            indices[p]
            for p in partition_microbatches(lengths, self.batching.max_tokens_per_microbatch)
        ]

    # ----------------------------------------------------------------------------- validation
    @property
    def valid(self) -> ParallelCorpus | TaggedCorpus | None:
        """The validation set (of the first direction); None without one."""
        return next(iter(self.valid_sets.values()), None)

    def _of(self, direction: str) -> str:
        """`` of en-de`` where there are several validation directions (else nothing to tell)."""
        return f" of {direction}" if len(self.valid_sets) > 1 else ""

    def valid_batches(self, direction: str | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's share of the validation split of ``direction`` (default: the first), in
        length order, under the same budget. Sentences longer than the model's positions or the
        budget are truncated (counted, logged once): validation never stops a run."""
        direction = next(iter(self.valid_sets), "") if direction is None else direction
        if direction not in self.valid_sets:
            return
        valid = self.valid_sets[direction]
        limits = self._valid_limits()
        src = np.minimum(valid.src_lengths, limits[0])
        tgt = np.minimum(valid.tgt_lengths, limits[1])
        cfg = dataclasses.replace(
            self.batching, batch_noise=0.0, competence_updates=0, curriculum_epochs=0
        )
        batches = shard(
            global_batches(src, tgt, cfg, seed=0, epoch=0, shuffle=False),
            num_replicas=self.world_size,
            rank=self.rank,
        )
        for i in range(len(batches)):
            indices = batches[i]
            if indices.size:
                samples = [valid[int(j)] for j in indices]
                yield collate(
                    [(truncate(s, limits[0]), truncate(t, limits[1])) for s, t in samples],
                    pad_id=PAD_ID,
                    bos_id=BOS_ID,
                    layout=self.batching.layout,
                )

    def _valid_limits(self) -> tuple[int, int]:
        budget = self.batching.max_tokens
        positions = self.max_positions or (budget, budget)
        return min(positions[0], budget), min(positions[1], budget)

    def _report_long_valid_pairs(self) -> None:
        src_limit, tgt_limit = self._valid_limits()
        for name, valid in self.valid_sets.items():
            too_long = int(
                ((valid.src_lengths > src_limit) | (valid.tgt_lengths > tgt_limit)).sum()
            )
            if too_long:
                logger.warning(
                    "%d of %d validation pairs%s are longer than the model's positions or "
                    "--max-tokens (source %d, target %d tokens): they are truncated for validation",
                    too_long,
                    len(valid),
                    self._of(name),
                    src_limit,
                    tgt_limit,
                )

    # ----------------------------------------------------------------------------- resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch_index,  # 0-based in checkpoints
            "epoch_start_update": self.epoch_start_update,
            "updates_done": self.updates_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"]) + 1
        self.epoch_start_update = int(state["epoch_start_update"])
        self.updates_done = int(state["updates_done"])
        self._current = None

    def close(self) -> None:
        if self.blend is not None:
            self.blend.close()


def made_ahead(
    make: Callable[[np.ndarray], dict[str, torch.Tensor]],
    batches: Sequence[np.ndarray],
    *,
    ahead: int,
) -> Iterator[dict[str, torch.Tensor]]:
    """``make(batch)`` of each batch in order, the next ``ahead`` made by a thread while the caller
    trains on the current one: collation (numpy, and reads of the memory-mapped corpus) leaves the
    update's critical path. ``make`` is a pure function of the batch, so the batches are exactly
    those made here; pending ones are dropped when the caller stops early."""
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="collate")
    pending: collections.deque[concurrent.futures.Future[dict[str, torch.Tensor]]] = (
        collections.deque()
    )
    try:
        for batch in batches:
            pending.append(executor.submit(make, batch))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


class _BatchMaker:
    """Collates a rank batch of one epoch's dataset; a dummy (empty) batch gets sample 0, at zero weight.
    A plain object (not a closure) so DataLoader workers can receive it."""

    def __init__(self, dataset: ParallelCorpus | BlendedCorpus, plan: TrainingDataPlan) -> None:
        self.dataset = dataset
        self.static = plan.static
        self.layout = plan.batching.layout

    def __call__(self, indices: np.ndarray) -> dict[str, torch.Tensor]:
        indices = indices if indices.size else np.zeros(1, dtype=np.int64)
        samples = [self.dataset[int(i)] for i in indices]
        if self.static is not None:
            return self.static.collate(samples)
        return collate(samples, pad_id=PAD_ID, bos_id=BOS_ID, layout=self.layout)


class _Batches(torch.utils.data.Dataset):
    """A rank's batches for the rest of an epoch, in order, collated where the DataLoader runs it."""

    def __init__(self, batches: list[np.ndarray], make: _BatchMaker) -> None:
        self.batches = batches
        self.make = make

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.make(self.batches[index])

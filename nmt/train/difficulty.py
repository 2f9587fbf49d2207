"""``--curriculum model:CHECKPOINT``: training pairs scored by a trained model's loss per target token.

The data plan deals chunks of the corpora out to ranks, calls the scorer on each chunk, and sorts
the scores globally (``distributed_sample_sort``). Chunks are aligned the same way for any number
of ranks and each is scored the same way (length order, batches cut by the token-budget batcher),
so no score depends on the rank that computed it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import load_checkpoint, tensor_to_bytes
from nmt.data.batching import greedy_offsets
from nmt.data.collate import Sample, collate
from nmt.data.difficulty import DifficultyScorer
from nmt.data.manifest import Manifest
from nmt.data.plan import truncate
from nmt.data.spm import BOS_ID, PAD_ID
from nmt.model import load_model

SCORE_BATCH_TOKENS = 8192  # padded tokens per scoring batch


def checkpoint_scorer(
    path: str,
    *,
    manifest: Manifest,
    device: torch.device,
    option: str | None = None,
    reverse: bool = False,
) -> DifficultyScorer:
    """A scorer from a checkpoint trained on this dataset's vocabulary (checked, not assumed): each
    pair's cross-entropy per target token (with EOS). ``reverse``: the model translates the
    dataset's target into its source, and scores the source given the target. ``option``: what
    errors name (default ``--curriculum model:PATH``)."""
    option = option or f"--curriculum model:{path}"
    try:
        state = load_checkpoint(path)
    except ValueError as error:
        raise ValueError(f"{option}: {error}") from None
    sides = [manifest.spm.src_model, manifest.spm.tgt_model]
    langs = [manifest.source_lang, manifest.target_lang]
    if reverse:
        sides.reverse()
        langs.reverse()
    found = [state["vocab"].get("source_lang"), state["vocab"].get("target_lang")]
    if None not in found and found != langs:
        raise ValueError(
            f"{option}: translates {found[0]}->{found[1]}; scoring {manifest.directory} needs {langs[0]}->{langs[1]}"
        )
    for side, name in zip(("src", "tgt"), sides):
        with open(manifest.path(name), "rb") as handle:
            if tensor_to_bytes(state["vocab"][f"{side}_spm"]) != handle.read():
                raise ValueError(
                    f"{option}: the checkpoint's vocabulary is not {manifest.path(name)}; score with a model of this dataset"
                )
    model = load_model(state, name=option).to(device)
    limits = (model.cfg.max_source_positions, model.cfg.max_target_positions)

    @torch.no_grad()
    def score(samples: Sequence[Sample]) -> np.ndarray:
        pairs = [
            (truncate(src, limits[0]), truncate(tgt, limits[1]))
            for src, tgt in (((t, s) for s, t in samples) if reverse else samples)
        ]
        longest = np.array([max(len(s), len(t)) for s, t in pairs], dtype=np.int64)
        order = np.argsort(-longest, kind="stable")
        offsets = greedy_offsets(longest[order], longest[order], SCORE_BATCH_TOKENS, packed=False)
        scores = np.empty(len(pairs), dtype=np.float64)
        for start, stop in zip(offsets[:-1], offsets[1:]):
            indices = order[start:stop]
            batch = collate(
                [pairs[i] for i in indices], pad_id=PAD_ID, bos_id=BOS_ID, layout="padded"
            )
            batch = {k: v.to(device) for k, v in batch.items()}
            hidden = model(
                batch["src_tokens"],
                batch["src_lengths"],
                batch["prev_output_tokens"],
                batch["tgt_lengths"],
            )
            logits = model.output_projection(hidden).float()  # (B, T, V)
            nll = F.cross_entropy(
                logits.transpose(1, 2), batch["target"], ignore_index=PAD_ID, reduction="none"
            )  # (B, T)
            per_token = nll.sum(1) / batch["tgt_lengths"].clamp(min=1)
            scores[indices] = per_token.double().cpu().numpy()
        return scores

    return score

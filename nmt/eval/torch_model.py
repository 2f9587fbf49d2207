"""The PyTorch side of a :class:`~nmt.eval.translate.Translator`: checkpoints loaded on a device (one
model, an ensemble, or averaged weights), searched batch by batch (``nmt.eval.search``) and scored
by forced decoding. The Translator imports this module only for checkpoints: an exported CTranslate2
model (``nmt.eval.ct2_model``) translates without importing torch at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from nmt.checkpoint_io import (
    load_averaged_checkpoint,
    load_model_checkpoint,
    same_vocab,
    tensor_to_bytes,
)
from nmt.config import EvalConfig
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, SPECIAL_IDS, SentencePieceModel
from nmt.device import resolve_device
from nmt.eval.ensemble import Ensemble
from nmt.eval.hypothesis import Hypothesis
from nmt.eval.search import generate
from nmt.languages import Languages
from nmt.model import TransformerModel, load_model

logger = logging.getLogger("nmt.eval")


def decode_dtype(device: torch.device, precision: str | torch.dtype | None) -> torch.dtype | None:
    """The weights' dtype for ``precision`` ("float16", "bfloat16" or a torch dtype) on ``device``;
    None keeps float32.

    On the CPU half precision is ignored with one warning: half-precision matrix products there are
    slower than float32 (fairseq users type --fp16 out of habit; a 4x slower decode with no word was issue 13).
    """
    if precision is None:
        return None
    dtype = getattr(torch, precision) if isinstance(precision, str) else precision
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"decoding precision: float16, bfloat16 or float32, got {precision}")
    if device.type == "cpu" and dtype != torch.float32:
        flag = "--fp16" if dtype == torch.float16 else "--bf16"
        logger.warning(
            "%s ignored on the CPU (half-precision is slower there): decoding in float32", flag
        )
        return None
    return dtype


def load_models(
    paths: Sequence[str],
    *,
    device: str | torch.device,
    average: bool,
    dtype: str | torch.dtype | None,
) -> tuple[list[TransformerModel], SentencePieceModel, SentencePieceModel, Languages]:
    """Checkpoints -> the models on ``device`` with the SentencePiece models and the directions
    they carry."""
    device = resolve_device(str(device))
    dtype = decode_dtype(device, dtype)
    logger.info("decoding on %s with PyTorch", device)
    if average or len(paths) == 1:
        named_states = [(paths[0], load_averaged_checkpoint(paths))]
    else:
        named_states = [(p, load_model_checkpoint(p)) for p in paths]
    first_path, first = named_states[0]
    for other_path, state in named_states[1:]:
        if not same_vocab(state["vocab"], first["vocab"]):
            raise ValueError(
                f"{other_path}: vocabulary differs from {first_path}'s; the models of an ensemble "
                "must share their SentencePiece models and languages"
            )
    vocab = first["vocab"]
    if vocab.get("special_ids") != SPECIAL_IDS:
        raise ValueError(
            f"{first_path}: special ids {vocab.get('special_ids')} differ from the toolkit's {SPECIAL_IDS}"
        )
    models = [
        load_model(state, name=name).to(device=device, dtype=dtype) for name, state in named_states
    ]
    src_spm = SentencePieceModel(
        tensor_to_bytes(vocab["src_spm"]), name=f"{first_path} (source SentencePiece model)"
    )
    tgt_spm = SentencePieceModel(
        tensor_to_bytes(vocab["tgt_spm"]), name=f"{first_path} (target SentencePiece model)"
    )
    return models, src_spm, tgt_spm, Languages.from_vocab(vocab)


class TorchModels:
    """One model or an ensemble (the mean of their probabilities) on one device."""

    forced_decoding = True  # score_batch: given targets scored by a teacher-forced forward

    def __init__(self, models: Sequence[TransformerModel], *, banned: Sequence[int] = ()) -> None:
        """``banned``: target ids never generated (the vocabulary's tags)."""
        self.models = [model.eval() for model in models]
        self.banned = list(banned)
        self.ensemble = Ensemble(self.models)
        self.device = next(self.models[0].parameters()).device
        self.max_source_positions = self.ensemble.max_source_positions
        self.max_target_positions = self.ensemble.max_target_positions

    def searcher(
        self, cfg: EvalConfig, *, ordered_constraints: bool = False
    ) -> Callable[..., list[list[Hypothesis]]]:
        """The search of one batch (sources, EOS last, cut to lengths), for one ``generate`` call: a
        sampling search draws from one generator seeded with ``cfg.seed`` across its batches."""
        generator = torch.Generator(self.device).manual_seed(cfg.seed) if cfg.sampling else None

        def search(
            sources: list[np.ndarray],
            lengths: np.ndarray,
            first_tokens: list[int] | None = None,
            constraints: list[list[list[int]]] | None = None,
        ) -> list[list[Hypothesis]]:
            src_tokens, src_lengths = self.collate(sources, lengths)
            return generate(
                self.ensemble,
                src_tokens,
                src_lengths,
                cfg,
                generator=generator,
                banned=self.banned,
                first_tokens=None
                if first_tokens is None
                else torch.tensor(first_tokens, dtype=torch.long, device=self.device),
                constraints=constraints,
                ordered_constraints=ordered_constraints,
            )

        return search

    @torch.inference_mode()
    def score_batch(
        self,
        sources: list[np.ndarray],
        src_lengths: np.ndarray,
        targets: np.ndarray,
        *,
        temperature: float,
        need_attention: bool,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Forced decoding of ``targets`` (B, T) (PAD after each one's EOS): token log-probabilities
        (B, T) and, with ``need_attention``, the last decoder layer's cross-attention (B, T, S)."""
        src_tokens, batch_src_lengths = self.collate(sources, src_lengths)
        target = torch.from_numpy(targets).to(self.device)
        prev_output = torch.cat([torch.full_like(target[:, :1], BOS_ID), target[:, :-1]], dim=1)
        scores, attention = self.ensemble.score_targets(
            src_tokens,
            batch_src_lengths,
            prev_output,
            target,
            temperature=temperature,
            need_attention=need_attention,
        )
        return scores.cpu().numpy(), None if attention is None else attention.cpu().numpy()

    def collate(
        self, sources: list[np.ndarray], lengths: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded (B, S) int64 source and lengths (B,); over-long sources keep their EOS."""
        tokens = np.full((len(sources), int(lengths.max())), PAD_ID, dtype=np.int64)
        for row, (source, length) in enumerate(zip(sources, lengths)):
            tokens[row, : length - 1] = source[: length - 1]
            tokens[row, length - 1] = EOS_ID
        return torch.from_numpy(tokens).to(self.device), torch.from_numpy(lengths).to(self.device)

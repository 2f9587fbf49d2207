"""Several models decoded as one: fairseq's ensemble (``--path a.pt:b.pt``).

At every step each model scores the next token from its own decoder state; the ensemble's
log-probability is the log of the models' mean probability, ``logsumexp_m(log p_m) - log M`` (fairseq's
``EnsembleModel``). The search sees one model: ``start`` (encode), ``next_log_probs`` (one step),
``reorder``/``reorder_beams`` on the state. One model is the plain case: its logits go through the
same single ``log_softmax`` as before, so wrapping it costs nothing measurable.

Forced decoding (``score_targets``) scores given targets in one teacher-forced pass per model:
per-token log-probabilities (fairseq's positional scores), and optionally the last decoder layer's
cross-attention (alignments), averaged over the models.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nmt.model import DecoderState, TransformerModel


@dataclass
class EnsembleState:
    """One decoder state per model, reordered together."""

    states: list[DecoderState]

    def reorder(self, index: torch.Tensor) -> None:
        for state in self.states:
            state.reorder(index)

    def reorder_beams(self, index: torch.Tensor) -> None:
        for state in self.states:
            state.reorder_beams(index)


class Ensemble:
    def __init__(self, models: Sequence[TransformerModel]) -> None:
        assert models, "an ensemble needs at least one model"
        self.models = list(models)
        # A sentence must fit every model's positions.
        self.max_source_positions = min(model.cfg.max_source_positions for model in self.models)
        self.max_target_positions = min(model.cfg.max_target_positions for model in self.models)

    def __len__(self) -> int:
        return len(self.models)

    def start(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> EnsembleState:
        """Encode the padded source (B, S) once per model; the decoder states start empty."""
        return EnsembleState(
            [
                model.init_decoder_state(model.encode(src_tokens, src_lengths))
                for model in self.models
            ]
        )

    def next_log_probs(
        self, tokens: torch.Tensor, state: EnsembleState, *, temperature: float
    ) -> torch.Tensor:
        """Feed ``tokens`` (R,) and return the next token's log-probabilities (R, V) in float32
        (fp16 models sum scores in fp32); every model's state advances one step."""
        per_model = [
            _log_softmax(model.decode_step(tokens, model_state), temperature)
            for model, model_state in zip(self.models, state.states)
        ]
        return per_model[0] if len(per_model) == 1 else _mean_probability(torch.stack(per_model))

    def score_targets(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor,
        prev_output_tokens: torch.Tensor,
        target: torch.Tensor,
        *,
        temperature: float,
        need_attention: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced scores of padded ``target`` (B, T) (decoder input ``prev_output_tokens``
        = BOS + target[:-1]): per-token log-probabilities (B, T) in float32 (padding positions
        hold garbage: mask them) and, with ``need_attention``, cross-attention (B, T, S) averaged
        over the models."""
        token_lprobs, attentions = [], []
        for model in self.models:
            with (
                model.recording_cross_attention()
                if need_attention
                else contextlib.nullcontext([]) as recorded
            ):
                states = model(src_tokens, src_lengths, prev_output_tokens, None)  # (B, T, D)
            lprobs = _log_softmax(model.output_projection(states), temperature)  # (B, T, V)
            token_lprobs.append(lprobs.gather(-1, target[..., None]).squeeze(-1))  # (B, T)
            if need_attention:
                attentions.append(recorded[0].float())
        scores = (
            token_lprobs[0]
            if len(token_lprobs) == 1
            else _mean_probability(torch.stack(token_lprobs))
        )
        attention = torch.stack(attentions).mean(dim=0) if need_attention else None
        return scores, attention


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return F.log_softmax(logits, dim=-1)


def _mean_probability(log_probs: torch.Tensor) -> torch.Tensor:
    """(M, ...) log-probabilities of M models -> the log of their mean probability (...)."""
    return torch.logsumexp(log_probs, dim=0) - math.log(log_probs.shape[0])

"""Greedy, sampling and beam search over the decoder's incremental state (one token per step).

All three work on a padded source batch and return, per sentence, ``nbest`` hypotheses best first.
Conventions are fairseq's, so scores and BLEU are comparable with ``fairseq-generate``:

- a hypothesis ends with EOS; its score is the sum of its token log-probabilities divided by
  ``length ** lenpen`` (length counts EOS); beams are ranked by the unnormalised sum;
- a sentence may generate at most ``max_len = int(max_len_a * src_len + max_len_b)`` tokens before
  EOS (``src_len`` counts the source EOS; capped by the model's positions), EOS is forced after
  that, and it is banned before ``min_len`` tokens;
- beam search keeps the best ``2 * beam`` candidates per step; an EOS candidate among the first
  ``beam`` of them is finished, the first ``beam`` non-EOS candidates go on; a sentence is done
  once ``beam`` hypotheses are finished.

Speed (CPU and GPU alike): every step is a handful of batched tensor ops over sentences x beams,
with no Python loop over either. Finished sentences are dropped from the batch (encoder side and
caches included), so the late steps of a batch only pay for its long sentences. The only host sync
per step is the check for newly finished sentences; maximum lengths are known on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from nmt.config import EvalConfig
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID
from nmt.eval.constraints import NO_TOKEN, BatchConstraints, Progress, dynamic_beam_order
from nmt.eval.ensemble import Ensemble, EnsembleState
from nmt.eval.hypothesis import Hypothesis, max_target_lengths
from nmt.model import TransformerModel


@torch.inference_mode()
def generate(
    model: TransformerModel | Ensemble,
    src_tokens: torch.Tensor,
    src_lengths: torch.Tensor,
    cfg: EvalConfig,
    *,
    generator: torch.Generator | None = None,
    banned: Sequence[int] = (),
    first_tokens: torch.Tensor | None = None,
    constraints: Sequence[Sequence[Sequence[int]]] | None = None,
    ordered_constraints: bool = False,
) -> list[list[Hypothesis]]:
    """Padded source (B, S) with lengths (B,) (EOS included) -> per sentence, ``cfg.nbest`` hypotheses.

    PAD, BOS and ``banned`` (the vocabulary's tags) are never generated. ``first_tokens`` (B,):
    each sentence's first output token is forced to it (a multilingual model's target tag on the
    decoder side), scored 0 and left out of the hypotheses and of their length (``lenpen``); that
    token does not count towards ``min_len`` and the length limit.

    ``cfg.beam == 1`` takes the greedy path; ``cfg.sampling`` draws ``cfg.beam`` samples per
    sentence (with ``generator`` for reproducibility) and keeps the ``cfg.nbest`` best-scoring.
    An ``Ensemble`` of several models decodes with the mean of their probabilities at every step.

    ``constraints``: per sentence, phrases (piece ids) every hypothesis must contain
    (``nmt.eval.constraints``; beam search, any ``cfg.beam``; ``ordered_constraints``: in order);
    a hypothesis that could not meet them within its length limit ranks after those that did.
    """
    ensemble = model if isinstance(model, Ensemble) else Ensemble([model])
    forced = 0 if first_tokens is None else 1
    max_len = max_target_lengths(
        src_lengths.cpu().numpy(), cfg, max_positions=ensemble.max_target_positions - forced
    )
    if forced:
        max_len, cfg = max_len + 1, dataclasses.replace(cfg, min_len=cfg.min_len + 1)
    state = ensemble.start(src_tokens, src_lengths)
    never = torch.tensor([PAD_ID, BOS_ID, *banned], dtype=torch.long, device=src_tokens.device)
    if constraints is not None and not any(constraints):
        constraints = None  # the plain search finds the same, with fewer operations per step
    assert constraints is None or not cfg.sampling, "refused with sampling where they are given"
    if constraints is None and (cfg.sampling or cfg.beam == 1):
        found = _one_token_per_row(
            ensemble,
            state,
            max_len,
            cfg,
            generator=generator,
            device=src_tokens.device,
            never=never,
            first_tokens=first_tokens,
        )
    else:  # constrained too, whatever the beam: the banks need the beam's bookkeeping
        found = _beam_search(
            ensemble,
            state,
            max_len,
            cfg,
            device=src_tokens.device,
            never=never,
            first_tokens=first_tokens,
            constraints=None
            if constraints is None
            else BatchConstraints(
                constraints, ordered=ordered_constraints, device=src_tokens.device
            ),
        )
    if forced:
        for nbest in found:
            for hypothesis in nbest:
                hypothesis.tokens = hypothesis.tokens[1:]
    return found


def _next_log_probs(
    ensemble: Ensemble,
    state: EnsembleState,
    prefix: torch.Tensor,
    *,
    step: int,
    force_eos: torch.Tensor | None,
    cfg: EvalConfig,
    never: torch.Tensor,
    first_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probabilities (R, V) of the token after ``prefix`` (R, step + 1) (BOS first), constraints applied.

    ``force_eos`` (R,) bool marks rows past their maximum length (None: no row is).
    ``first_tokens`` (R,): at step 0, each row's only possible token (log-probability 0).
    """
    lprobs = ensemble.next_log_probs(prefix[:, -1], state, temperature=cfg.temperature)  # (R, V)
    if step == 0 and first_tokens is not None:
        return torch.full_like(lprobs, -torch.inf).scatter_(1, first_tokens[:, None], 0.0)
    lprobs[:, never] = -torch.inf  # PAD, BOS, tags
    if cfg.no_repeat_ngram_size and prefix.shape[1] >= cfg.no_repeat_ngram_size:
        _ban_repeated_ngrams(lprobs, prefix, cfg.no_repeat_ngram_size)
    if step < cfg.min_len:
        # Ban EOS, unless nothing else is left (n-gram bans, tiny vocabularies): a short output beats
        # a row with no finite continuation (which greedy would fill with PAD and sampling cannot draw).
        eos_lprobs = lprobs[:, EOS_ID].clone()
        lprobs[:, EOS_ID] = -torch.inf
        stuck = lprobs.amax(dim=-1) == -torch.inf
        lprobs[:, EOS_ID] = eos_lprobs.masked_fill(~stuck, -torch.inf)
    if force_eos is not None:
        # Keep the model's own EOS log-prob (fairseq does): the forced ending is scored, not free.
        not_eos = torch.ones(lprobs.shape[1], dtype=torch.bool, device=lprobs.device)
        not_eos[EOS_ID] = False
        lprobs.masked_fill_(force_eos[:, None] & not_eos, -torch.inf)
    return lprobs


def _ban_repeated_ngrams(lprobs: torch.Tensor, prefix: torch.Tensor, size: int) -> None:
    """Ban (in place) every token that would complete an n-gram already in ``prefix`` (R, t)."""
    windows = prefix.unfold(1, size, 1)  # (R, W, size): every n-gram so far
    suffix = prefix[
        :, prefix.shape[1] - (size - 1) :
    ]  # (R, size-1): what the next token would extend
    match = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=-1)  # (R, W)
    # scatter_add, not scatter: the same token may end a matching and a non-matching window.
    hits = torch.zeros_like(lprobs).scatter_add_(1, windows[:, :, -1], match.to(lprobs.dtype))
    lprobs.masked_fill_(hits > 0, -torch.inf)


def _force_eos_rows(
    step: int, max_len: np.ndarray, *, rows_per_sentence: int, device: torch.device
) -> torch.Tensor | None:
    """(R,) bool for rows whose sentence reached its maximum length; None (no work) when none has."""
    past = step >= max_len
    if not past.any():
        return None
    return torch.from_numpy(np.repeat(past, rows_per_sentence)).to(device)


def _sample(
    lprobs: torch.Tensor, cfg: EvalConfig, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row from ``lprobs`` (R, V), truncated to the top-k and/or the top-p nucleus."""
    if cfg.topk:
        kth_best = lprobs.topk(min(cfg.topk, lprobs.shape[1]), dim=-1).values[:, -1:]  # (R, 1)
        lprobs = lprobs.masked_fill(lprobs < kth_best, -torch.inf)
    if cfg.topp < 1.0:
        sorted_lprobs, order = lprobs.sort(dim=-1, descending=True)
        sorted_probs = sorted_lprobs.exp()
        # Keep the smallest prefix whose mass reaches p: a token goes when the mass before it already does.
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= cfg.topp
        lprobs = lprobs.masked_fill(
            torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted), -torch.inf
        )
    return torch.multinomial(lprobs.exp(), 1, generator=generator).squeeze(
        1
    )  # multinomial renormalises


def _one_token_per_row(
    ensemble: Ensemble,
    state: EnsembleState,
    max_len: np.ndarray,
    cfg: EvalConfig,
    *,
    generator: torch.Generator | None,
    device: torch.device,
    never: torch.Tensor,
    first_tokens: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Greedy (argmax) or sampling: each row extends one hypothesis; no beams to reorder.

    Sampling draws ``cfg.beam`` rows per sentence; greedy has one.
    """
    num_sentences = len(max_len)
    per_sentence = cfg.beam if cfg.sampling else 1
    num_rows = num_sentences * per_sentence
    if per_sentence > 1:
        state.reorder(torch.arange(num_sentences, device=device).repeat_interleave(per_sentence))
        if first_tokens is not None:
            first_tokens = first_tokens.repeat_interleave(per_sentence)
    row_max_len = np.repeat(max_len, per_sentence)
    finished = _Finished(
        num_rows,
        max_steps=int(max_len.max()) + 1,
        device=device,
        forced=int(first_tokens is not None),
    )
    rows = torch.arange(num_rows, device=device)  # original row of each active row
    prefix = torch.full((num_rows, 1), BOS_ID, dtype=torch.long, device=device)
    sums = torch.zeros(num_rows, device=device)
    for step in range(int(row_max_len.max()) + 1):
        force_eos = _force_eos_rows(step, row_max_len, rows_per_sentence=1, device=device)
        lprobs = _next_log_probs(
            ensemble,
            state,
            prefix,
            step=step,
            force_eos=force_eos,
            cfg=cfg,
            never=never,
            first_tokens=first_tokens,
        )
        tokens = _sample(lprobs, cfg, generator) if cfg.sampling else lprobs.argmax(dim=-1)  # (R,)
        sums = sums + lprobs.gather(1, tokens[:, None]).squeeze(1)
        prefix = torch.cat([prefix, tokens[:, None]], dim=1)
        ended = tokens == EOS_ID
        if not bool(ended.any()):  # the one host sync per step
            continue
        ended_rows = ended.nonzero().squeeze(1)
        finished.add(
            rows[ended_rows],
            prefix.index_select(0, ended_rows),
            sums[ended_rows],
            step=step,
            cfg=cfg,
        )
        keep = (~ended).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        state.reorder(keep)
        rows, prefix, sums = rows[keep], prefix.index_select(0, keep), sums[keep]
        row_max_len = row_max_len[keep.cpu().numpy()]
    return finished.best(num_sentences, per_sentence=per_sentence, nbest=cfg.nbest)


def _beam_search(
    ensemble: Ensemble,
    state: EnsembleState,
    max_len: np.ndarray,
    cfg: EvalConfig,
    *,
    device: torch.device,
    never: torch.Tensor,
    first_tokens: torch.Tensor | None = None,
    constraints: BatchConstraints | None = None,
) -> list[list[Hypothesis]]:
    num_sentences, beam = len(max_len), cfg.beam
    finished = _Finished(
        num_sentences * beam,
        max_steps=int(max_len.max()) + 1,
        device=device,
        forced=int(first_tokens is not None),
        constrained=constraints is not None,
    )
    num_finished = torch.zeros(num_sentences, dtype=torch.long, device=device)
    sentences = torch.arange(num_sentences, device=device)  # original index of each active sentence
    # All beams start identical, so the first step runs on one row per sentence (beam 0, the only
    # one with a finite score); the state grows to sentences x beams when that step's beams are chosen.
    prefix = torch.full((num_sentences, 1), BOS_ID, dtype=torch.long, device=device)  # (rows, t+1)
    sums = torch.full((num_sentences, beam), -torch.inf, device=device)  # (B, K) log-prob sums
    sums[:, 0] = 0.0
    progress = None if constraints is None else constraints.start(sentences)  # per row
    for step in range(int(max_len.max()) + 1):
        num_active = sentences.shape[0]
        rows_per_sentence = prefix.shape[0] // num_active  # 1 at the first step, then K
        force_eos = _force_eos_rows(
            step, max_len, rows_per_sentence=rows_per_sentence, device=device
        )
        lprobs = _next_log_probs(
            ensemble,
            state,
            prefix,
            step=step,
            force_eos=force_eos,
            cfg=cfg,
            never=never,
            first_tokens=first_tokens,  # step 0 runs one row per sentence
        )  # (rows, V)
        if progress is not None:
            # No EOS before every constraint is met, unless the length forces it.
            unmet = ~progress.met.all(dim=1)
            if force_eos is not None:
                unmet &= ~force_eos
            lprobs[:, EOS_ID] = lprobs[:, EOS_ID].masked_fill(unmet, -torch.inf)
        vocab_size = lprobs.shape[1]
        if constraints is None or progress is None:
            # (B, K, V) sums of every extension (broadcast over beams at the first step), flattened per sentence.
            candidates = (
                sums[:, :, None] + lprobs.view(num_active, rows_per_sentence, vocab_size)
            ).view(num_active, -1)
            top_sums, top_index = candidates.topk(2 * beam, dim=1)  # (B, 2K), best first
        else:  # (B, N): the banks' order (nmt.eval.constraints), not the scores'
            top_sums, top_index, progress = _constrained_candidates(
                sums, lprobs, progress, constraints, sentences=sentences
            )
        top_beams = torch.div(top_index, vocab_size, rounding_mode="floor")
        top_tokens = top_index % vocab_size
        # Row of each candidate's parent in the current state (every beam's parent is row 0 at first).
        top_rows = torch.arange(num_active, device=device)[
            :, None
        ] * rows_per_sentence + top_beams * (rows_per_sentence > 1)
        is_eos = top_tokens == EOS_ID  # (B, 2K)

        # Finish the EOS candidates among the first K (the fairseq rule), while a sentence has room.
        eos = is_eos[:, :beam] & top_sums[:, :beam].isfinite()  # (B, K)
        complete = None if progress is None else progress.met[:, :beam].all(dim=-1).reshape(-1)
        slot = num_finished[sentences][:, None] + eos.cumsum(dim=1) - 1  # (B, K)
        accept = eos & (slot < beam)
        finished.add(
            torch.where(accept, sentences[:, None] * beam + slot, finished.discard_row).view(-1),
            torch.cat(
                [
                    prefix.index_select(0, top_rows[:, :beam].reshape(-1)),
                    prefix.new_full((num_active * beam, 1), EOS_ID),
                ],
                dim=1,
            ),
            top_sums[:, :beam].reshape(-1),
            step=step,
            cfg=cfg,
            complete=complete,
        )
        num_finished.index_add_(0, sentences, accept.sum(dim=1))

        # The first K non-EOS candidates continue. There are always K: one EOS per beam at most among
        # 2K; with constraints two per row (a repeated copy scores -inf) among 2K + rows x (C + 1).
        num_candidates = top_index.shape[1]
        candidate_rank = torch.arange(num_candidates, device=device)
        keep_rank = (
            (is_eos * num_candidates + candidate_rank).topk(beam, dim=1, largest=False).indices
        )  # (B, K)
        next_rows = top_rows.gather(1, keep_rank)  # (B, K) parent rows in the current state
        next_tokens = top_tokens.gather(1, keep_rank)
        sums = top_sums.gather(1, keep_rank)
        if progress is not None:  # (B, N, C) -> (B, K, C), the continuing candidates'
            by_sentence = torch.arange(num_active, device=device)[:, None]
            progress = progress[by_sentence, keep_rank]

        done = num_finished[sentences] >= beam
        if progress is not None:
            done |= finished.settled(
                sentences, sums.amax(dim=1), step=step, max_len=max_len, per_sentence=beam, cfg=cfg
            )
        if step >= int(max_len.min()):
            done |= torch.from_numpy(step >= max_len).to(device)
        if bool(done.any()):  # the one host sync per step
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            next_rows, next_tokens, sums = next_rows[keep], next_tokens[keep], sums[keep]
            sentences = sentences[keep]
            if progress is not None:
                progress = progress[keep]
            max_len = max_len[keep.cpu().numpy()]
        if rows_per_sentence == 1 or next_rows.shape[0] < num_active:
            # Expanding to K beams, or dropping finished sentences: the encoder side changes too.
            state.reorder(next_rows.view(-1))
        else:
            state.reorder_beams(next_rows.view(-1))  # beams moved within their own sentence
        prefix = torch.cat(
            [prefix.index_select(0, next_rows.view(-1)), next_tokens.view(-1, 1)], dim=1
        )
        if progress is not None:
            progress = progress.flatten_beams()
    return finished.best(num_sentences, per_sentence=beam, nbest=cfg.nbest)


def _constrained_candidates(
    sums: torch.Tensor,
    lprobs: torch.Tensor,
    progress: Progress,
    constraints: BatchConstraints,
    *,
    sentences: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, Progress]:
    """Dynamic beam allocation's candidates, in its order: ``sums`` (B, K) of the beams (only beam
    0 finite at the first step), ``lprobs`` (R, V), ``progress`` (R, C) of the current rows.

    Returns sums (B, N), indices (B, N) (parent beam x V + token) and the candidates' Progress
    (B, N, C), N = 2K + rows per sentence x (C + 1): the 2K best, and for every row its best token
    and the next piece of each open constraint; a candidate found twice is kept once (the other
    copy scores -inf)."""
    (num_active, beam), (num_rows, vocab_size) = sums.shape, lprobs.shape
    rows_per_sentence = num_rows // num_active
    # The 2K best extensions of the beam are among the 2K best of each row: one pass over the
    # vocabulary finds them and each row's best token.
    row_lprobs, row_tokens = lprobs.topk(min(2 * beam, vocab_size), dim=1)  # (R, k), best first
    per_row = row_tokens.shape[1]
    beams = torch.arange(beam, device=sums.device)[None, :, None]
    row_index = beams * vocab_size + row_tokens.view(num_active, rows_per_sentence, per_row)
    row_sums = sums[:, :, None] + row_lprobs.view(num_active, rows_per_sentence, per_row)
    top_sums, top = row_sums.view(num_active, -1).topk(2 * beam, dim=1)  # (B, 2K)
    top_index = row_index.reshape(num_active, -1).gather(1, top)
    wanted = constraints.wanted(progress, sentences, rows_per_sentence)  # (R, C)
    extra_tokens = torch.cat([row_tokens[:, :1], wanted.clamp(min=0)], dim=1)  # (R, 1 + C)
    extra_index = (
        beams[:, :rows_per_sentence] * vocab_size
        + extra_tokens.view(num_active, rows_per_sentence, -1)
    ).view(num_active, -1)
    extra_sums = sums[:, :rows_per_sentence, None] + lprobs.gather(1, extra_tokens).view(
        num_active, rows_per_sentence, -1
    )
    no_extra = torch.cat([torch.zeros_like(wanted[:, :1], dtype=torch.bool), wanted == NO_TOKEN], 1)
    extra_sums = extra_sums.view(num_active, -1).masked_fill(
        no_extra.view(num_active, -1), -torch.inf
    )
    index = torch.cat([top_index, extra_index], dim=1)  # (B, N)
    sums = torch.cat([top_sums, extra_sums], dim=1)
    num = index.shape[1]
    earlier = torch.ones(num, num, dtype=torch.bool, device=index.device).tril(-1)
    repeated = ((index[:, :, None] == index[:, None, :]) & earlier).any(dim=-1)
    sums = sums.masked_fill(repeated, -torch.inf)

    # (B, N) each candidate's row in the current state (at the first step, the -inf beams' is row 0)
    first_row = torch.arange(num_active, device=index.device)[:, None] * rows_per_sentence
    parents = first_row + torch.div(index, vocab_size, rounding_mode="floor") * (
        rows_per_sentence > 1
    )
    moved, banks = constraints.advance(progress[parents], index % vocab_size, sentences)
    order = dynamic_beam_order(sums, banks, constraints.num_banks)  # (B, N)
    by_sentence = torch.arange(num_active, device=index.device)[:, None]
    return (
        sums.gather(1, order),
        index.gather(1, order),
        moved[by_sentence, order],
    )


class _Finished:
    """Finished hypotheses in fixed slots (``per_sentence`` per sentence), filled with tensor ops only.

    Writes aimed at ``discard_row`` (an extra slot) are thrown away: that keeps the beam step free of
    data-dependent shapes (no nonzero, no host sync).
    """

    def __init__(
        self,
        num_slots: int,
        *,
        max_steps: int,
        device: torch.device,
        forced: int = 0,
        constrained: bool = False,
    ) -> None:
        self.discard_row = num_slots
        self.forced = forced  # a forced first token (the decoder-side tag) is not in the length
        self.tokens = torch.full(
            (num_slots + 1, max_steps + 1), PAD_ID, dtype=torch.long, device=device
        )
        self.lengths = torch.zeros(num_slots + 1, dtype=torch.long, device=device)
        self.scores = torch.full((num_slots + 1,), -torch.inf, device=device)
        # With constraints: whether each hypothesis met them all (those that did rank first).
        self.complete = (
            torch.zeros(num_slots + 1, dtype=torch.bool, device=device) if constrained else None
        )

    def add(
        self,
        slots: torch.Tensor,
        prefixes: torch.Tensor,
        sums: torch.Tensor,
        *,
        step: int,
        cfg: EvalConfig,
        complete: torch.Tensor | None = None,
    ) -> None:
        """``prefixes`` (N, step + 2): BOS, tokens, EOS; ``sums`` (N,) their log-prob sums; into
        ``slots`` (N,); ``complete`` (N,): whether each met its constraints (with constraints only)."""
        length = step + 1  # generated tokens, EOS included
        self.tokens[:, : step + 2].index_copy_(0, slots, prefixes)
        self.lengths.index_fill_(0, slots, length)
        self.scores.index_copy_(0, slots, sums / (length - self.forced) ** cfg.lenpen)
        if self.complete is not None:
            assert complete is not None
            self.complete.index_copy_(0, slots, complete)

    def settled(
        self,
        sentences: torch.Tensor,
        best_sums: torch.Tensor,
        *,
        step: int,
        max_len: np.ndarray,
        per_sentence: int,
        cfg: EvalConfig,
    ) -> torch.Tensor:
        """(B,) whether each of ``sentences`` has its ``cfg.nbest`` best finished hypotheses met their
        constraints and scoring above all its active hypotheses (best log-prob sum ``best_sums``
        (B,) after ``step``) can still reach.

        Sums only fall, so a hypothesis ends at most at its sum now over the length (next step's to
        ``max_len``'s) that ``lenpen`` favours. Stopping then returns what waiting for
        ``per_sentence`` finished ones would (the later ones rank below), in fewer steps: with
        constraints that wait is long, as only the banks that met every constraint may end."""
        assert self.complete is not None
        scores = self.scores[:-1].view(-1, per_sentence)[sentences]
        complete = self.complete[:-1].view(-1, per_sentence)[sentences]
        kept = scores.masked_fill(~complete, -torch.inf).topk(cfg.nbest, dim=1).values[:, -1]
        # Lengths as ``add`` counts them (EOS in, the forced first token out).
        favoured = max_len + 1 if cfg.lenpen >= 0 else np.full_like(max_len, step + 2)
        length = torch.from_numpy(favoured - self.forced).to(best_sums)
        return kept > best_sums / length**cfg.lenpen

    def best(self, num_sentences: int, *, per_sentence: int, nbest: int) -> list[list[Hypothesis]]:
        scores = self.scores[:-1].view(num_sentences, per_sentence)
        order = scores.argsort(dim=1, descending=True, stable=True)  # (N, per_sentence)
        if self.complete is not None:  # those that met their constraints first, by score
            complete = self.complete[:-1].view(num_sentences, per_sentence).gather(1, order)
            order = order.gather(1, complete.int().argsort(dim=1, descending=True, stable=True))
        order = order[:, :nbest]  # (N, nbest)
        slots = (
            order + torch.arange(num_sentences, device=order.device)[:, None] * per_sentence
        ).view(-1)
        tokens = self.tokens.index_select(0, slots).tolist()
        lengths = self.lengths.index_select(0, slots).tolist()
        best_scores = self.scores.index_select(0, slots).tolist()
        hypotheses: list[list[Hypothesis]] = [[] for _ in range(num_sentences)]
        for index, (row, length, score) in enumerate(zip(tokens, lengths, best_scores)):
            if score != -float("inf"):  # tiny vocabularies may finish fewer than nbest
                hypotheses[index // nbest].append(Hypothesis(tokens=row[1:length], score=score))
        return hypotheses

"""Search correctness: exhaustive optimum, greedy == beam 1, batching invariance, constraints."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmt.config import EvalConfig
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID
from nmt.eval import Translator, generate
from nmt.eval.ensemble import Ensemble
from nmt.eval.search import _beam_search, max_target_lengths
from nmt.model import build_model

from ..helpers import padded, tiny_model_config

NEVER = torch.tensor([PAD_ID, BOS_ID])  # what generate() always bans

VOCAB = 6  # pad, bos, eos, unk + 2 pieces: every output of <= 3 tokens can be enumerated


def random_model(*, vocab_size: int, seed: int):
    torch.manual_seed(seed)
    cfg = tiny_model_config(
        vocab_size,
        dim=16,
        heads=2,
        encoder_layers=1,
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
    )
    model = build_model(cfg).eval()
    with (
        torch.no_grad()
    ):  # sharper distributions than the init's near-uniform ones: fewer near-ties
        model.output_projection.weight.mul_(8.0)
    return model


def teacher_forced_scores(
    model, source: list[int], outputs: list[list[int]], *, lenpen: float
) -> list[float]:
    """fairseq's score of each full output (ending with EOS): sum of log-probs / length ** lenpen."""
    src, src_lengths = padded([source] * len(outputs))
    prev, tgt_lengths = padded([[BOS_ID] + out[:-1] for out in outputs])
    target, _ = padded(outputs)
    with torch.no_grad():
        lprobs = F.log_softmax(
            model.output_projection(model(src, src_lengths, prev, tgt_lengths)), dim=-1
        )
    token_lprobs = lprobs.gather(2, target[:, :, None]).squeeze(2) * (target != PAD_ID)
    return (token_lprobs.sum(1) / tgt_lengths.float() ** lenpen).tolist()


@pytest.mark.parametrize("lenpen", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_finds_the_best_sequence_of_exhaustive_search(lenpen: float, seed: int) -> None:
    model = random_model(vocab_size=VOCAB, seed=seed)
    source = [4, 5, 4, 3, EOS_ID]
    pieces = [t for t in range(VOCAB) if t not in (PAD_ID, BOS_ID, EOS_ID)]
    # max_len 3: one to three tokens (min_len 1 bans the empty output), then EOS.
    outputs = [
        list(seq) + [EOS_ID] for n in (1, 2, 3) for seq in itertools.product(pieces, repeat=n)
    ]
    expected = sorted(
        zip(teacher_forced_scores(model, source, outputs, lenpen=lenpen), outputs), reverse=True
    )
    cfg = EvalConfig(beam=len(outputs) + 1, nbest=5, max_len_a=0.0, max_len_b=3, lenpen=lenpen)
    src, src_lengths = padded([source])
    (found,) = generate(model, src, src_lengths, cfg)
    assert [hyp.tokens + [EOS_ID] for hyp in found] == [out for _, out in expected[:5]]
    np.testing.assert_allclose(
        [hyp.score for hyp in found], [score for score, _ in expected[:5]], rtol=1e-5, atol=1e-5
    )


def test_beam_1_equals_greedy(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    sources = [np.array(ids + [EOS_ID]) for ids in translator.src_spm.encode(tiny.test_src)]
    src, src_lengths = translator.backend.collate(sources, np.array([len(s) for s in sources]))
    cfg = EvalConfig(beam=1)
    greedy = generate(translator.model, src, src_lengths, cfg)
    ensemble = Ensemble([translator.model])
    with torch.inference_mode():
        state = ensemble.start(src, src_lengths)
        max_len = max_target_lengths(
            src_lengths.numpy(), cfg, max_positions=ensemble.max_target_positions
        )
        beam = _beam_search(ensemble, state, max_len, cfg, device=src.device, never=NEVER)
    assert [h[0].tokens for h in beam] == [h[0].tokens for h in greedy]
    np.testing.assert_allclose([h[0].score for h in beam], [h[0].score for h in greedy], rtol=1e-5)


@pytest.mark.parametrize(
    "options",
    [dict(beam=1), dict(beam=4, nbest=3), dict(beam=3, no_repeat_ngram_size=2, lenpen=0.6)],
)
def test_batched_decoding_equals_one_by_one(tiny, options) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    sources = [np.array(ids + [EOS_ID]) for ids in translator.src_spm.encode(tiny.test_src)]
    one_by_one = translator.generate(sources, batch_size=1, **options)
    for batching in (dict(batch_size=64), dict(max_tokens=40)):
        batched = translator.generate(sources, **batching, **options)
        assert [[h.tokens for h in nbest] for nbest in batched] == [
            [h.tokens for h in nbest] for nbest in one_by_one
        ]
        np.testing.assert_allclose(
            [h.score for nbest in batched for h in nbest],
            [h.score for nbest in one_by_one for h in nbest],
            rtol=1e-4,
        )


def test_trained_model_translates_and_stops_early(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    hypotheses = translator.translate(tiny.test_src, beam=4)
    assert translator.score(hypotheses, tiny.test_tgt)[0].score > 50
    # Outputs end well before the maximum length: the EOS paths were taken.
    assert max(len(h.split()) for h in hypotheses) <= max(len(s.split()) for s in tiny.test_src) + 2


def test_nbest_is_sorted_distinct_and_within_max_length(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    sources = [np.array(ids + [EOS_ID]) for ids in translator.src_spm.encode(tiny.test_src)]
    cfg = dict(beam=5, nbest=5, max_len_a=0.5, max_len_b=1)
    for source, nbest in zip(sources, translator.generate(sources, **cfg)):
        assert len(nbest) == 5
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in nbest}) == 5
        assert all(len(h.tokens) <= int(0.5 * len(source) + 1) for h in nbest)
        assert all(
            EOS_ID not in h.tokens and BOS_ID not in h.tokens and PAD_ID not in h.tokens
            for h in nbest
        )


@pytest.mark.parametrize("options", [dict(beam=1), dict(beam=4), dict(beam=2, sampling=True)])
def test_no_repeat_ngram_size(options) -> None:
    model = random_model(vocab_size=8, seed=3)  # a random model repeats itself a lot
    src, src_lengths = padded([[4, 5, 6, 7, EOS_ID], [5, 5, EOS_ID]])
    # min_len 20 keeps outputs long; when the bans leave no other token, EOS ends the output early.
    lengths = dict(max_len_a=0.0, max_len_b=20, min_len=20)
    for hyp, *_ in generate(
        model, src, src_lengths, EvalConfig(**lengths, no_repeat_ngram_size=2, **options)
    ):
        bigrams = list(zip([BOS_ID] + hyp.tokens, hyp.tokens))
        assert len(bigrams) == len(set(bigrams))
        assert PAD_ID not in hyp.tokens
    unconstrained = generate(model, src, src_lengths, EvalConfig(**lengths, **options))
    assert all(
        len(set(zip(h[0].tokens, h[0].tokens[1:]))) < len(h[0].tokens) - 1 for h in unconstrained
    )


def test_sampling_is_reproducible_and_topk_1_is_greedy(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    lines = tiny.test_src[:8]
    first = translator.translate(lines, sampling=True, beam=3, temperature=1.5, seed=7)
    assert translator.translate(lines, sampling=True, beam=3, temperature=1.5, seed=7) == first
    assert translator.translate(lines, sampling=True, topk=1) == translator.translate(lines, beam=1)
    assert translator.translate(lines, sampling=True, topp=1e-6) == translator.translate(
        lines, beam=1
    )
    nbest = translator.translate_nbest(lines, sampling=True, beam=4, nbest=4, topk=5)
    assert all([t.score for t in n] == sorted([t.score for t in n], reverse=True) for n in nbest)


def test_config_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="--nbest"):
        EvalConfig(beam=2, nbest=3)
    with pytest.raises(ValueError, match="--topk: only applies with --sampling"):
        EvalConfig(topk=5)
    with pytest.raises(ValueError, match="--topp"):
        EvalConfig(sampling=True, topp=0.0)


def test_tags_are_never_generated(tmp_path) -> None:
    """The vocabulary's tags (language and back-translation tags) are banned like PAD and BOS,
    whatever the model prefers: here a model whose output bias favours a tag above all."""
    torch.manual_seed(3)
    model = build_model(
        tiny_model_config(20, layers=1, dim=16, ffn=16, heads=2, output_bias=True)
    ).eval()
    with torch.no_grad():
        model.output_projection.bias[5] = 50.0
    src = torch.tensor([[7, 8, 9, EOS_ID]])
    lengths = torch.tensor([4])
    for cfg in (EvalConfig(beam=1), EvalConfig(beam=3), EvalConfig(beam=2, sampling=True)):
        free = generate(model, src, lengths, cfg, generator=torch.Generator().manual_seed(0))
        assert 5 in free[0][0].tokens  # the model wants the tag
        banned = generate(
            model, src, lengths, cfg, generator=torch.Generator().manual_seed(0), banned=[5]
        )
        assert all(5 not in hypothesis.tokens for hypothesis in banned[0])

"""Ensembles (--path a.pt:b.pt) and forced decoding: the mean of the models' probabilities, checked
against each model's own teacher-forced distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import atomic_torch_save, load_checkpoint
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID
from nmt.eval import Translator
from nmt.eval.search import max_target_lengths


@pytest.fixture(scope="module")
def perturbed(tiny, tmp_path_factory) -> str:
    """Another model of the same vocabulary: the tiny one with seeded noise on every weight."""
    state = load_checkpoint(tiny.checkpoint)
    generator = torch.Generator().manual_seed(7)
    state["model"] = {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
        if tensor.is_floating_point()
        else tensor
        for name, tensor in state["model"].items()
    }
    path = str(tmp_path_factory.mktemp("perturbed") / "perturbed.pt")
    atomic_torch_save(state, path)
    return path


def full_log_probs(translator: Translator, source: np.ndarray, target: list[int]) -> torch.Tensor:
    """(T, V) next-token log-probabilities of one model along ``target`` (teacher-forced)."""
    src = torch.from_numpy(source)[None]
    prev = torch.tensor([[BOS_ID] + target[:-1]])
    with torch.no_grad():
        states = translator.model(src, torch.tensor([len(source)]), prev, None)
        return F.log_softmax(translator.model.output_projection(states)[0], dim=-1)


def test_ensemble_follows_the_mean_probability_of_its_models(tiny, perturbed) -> None:
    single = [Translator.from_checkpoint(tiny.checkpoint), Translator.from_checkpoint(perturbed)]
    both = Translator.from_checkpoint([tiny.checkpoint, perturbed])
    assert len(both.backend.models) == 2
    sources = both.encode(tiny.test_src[:10])
    hypotheses = both.generate(sources, beam=1)
    differs = False
    for source, (hypothesis,) in zip(sources, hypotheses):
        target = hypothesis.tokens + [EOS_ID]
        per_model = torch.stack([full_log_probs(t, source, target) for t in single])  # (2, T, V)
        mixture = torch.logsumexp(per_model, dim=0) - math.log(2)  # (T, V)
        chosen = mixture.gather(1, torch.tensor(target)[:, None]).squeeze(1)
        # Greedy picks the mixture's best token at every step (PAD/BOS never, EOS not first: min_len 1).
        allowed = mixture.clone()
        allowed[:, [PAD_ID, BOS_ID]] = -torch.inf
        allowed[0, EOS_ID] = -torch.inf
        # EOS is forced after max_len tokens (1.2 * source length + 10): the last step is no choice then.
        forced_end = (
            len(hypothesis.tokens)
            >= max_target_lengths(np.array([len(source)]), both.config, max_positions=64)[0]
        )
        checked = len(target) - 1 if forced_end else len(target)
        assert allowed.argmax(dim=1).tolist()[:checked] == target[:checked]
        assert hypothesis.score == pytest.approx(float(chosen.sum()) / len(target), abs=1e-4)
        forced = both.score_targets([source], [target])[0].token_scores
        np.testing.assert_allclose(forced, chosen.numpy(), atol=1e-4)
        differs |= bool((per_model[0].argmax(1) != per_model[1].argmax(1)).any())
    assert differs, (
        "the two models never disagree: the test would not tell an ensemble from one model"
    )


def test_ensemble_of_one_model_twice_is_that_model(tiny, tmp_path) -> None:
    copy = str(tmp_path / "copy.pt")
    atomic_torch_save(load_checkpoint(tiny.checkpoint), copy)
    one = Translator.from_checkpoint(tiny.checkpoint).translate_nbest(
        tiny.test_src[:6], beam=3, nbest=2
    )
    two = Translator.from_checkpoint([tiny.checkpoint, copy]).translate_nbest(
        tiny.test_src[:6], beam=3, nbest=2
    )
    assert [[t.text for t in n] for n in two] == [[t.text for t in n] for n in one]
    np.testing.assert_allclose(
        [t.score for n in two for t in n], [t.score for n in one for t in n], atol=1e-5
    )


def test_ensemble_needs_one_vocabulary(tiny, tmp_path) -> None:
    state = load_checkpoint(tiny.checkpoint)
    state["vocab"] = {**state["vocab"], "target_lang": "fr"}
    other = str(tmp_path / "other.pt")
    atomic_torch_save(state, other)
    with pytest.raises(ValueError, match="other.pt: vocabulary differs"):
        Translator.from_checkpoint([tiny.checkpoint, other])


def test_averaging_is_asked_for_explicitly(tiny, perturbed) -> None:
    averaged = Translator.from_checkpoint([tiny.checkpoint, perturbed], average=True)
    assert len(averaged.backend.models) == 1
    expected = (
        load_checkpoint(tiny.checkpoint)["model"]["output_projection.weight"]
        + load_checkpoint(perturbed)["model"]["output_projection.weight"]
    ) / 2
    torch.testing.assert_close(averaged.model.output_projection.weight.detach(), expected)


def test_added_token_scores_and_alignments_agree_with_the_search(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    sources = translator.encode(["", *tiny.test_src[:8]])
    lenpen = 0.6
    nbest = translator.detokenize(translator.generate(sources, beam=4, nbest=3, lenpen=lenpen))
    translator.add_token_scores(sources, nbest, alignment=True)
    assert (
        nbest[0][0].positional_scores == [] and nbest[0][0].alignment == []
    )  # empty line: never decoded
    diagonal = total = 0
    for source, translations in zip(sources[1:], nbest[1:]):
        for translation in translations:
            scores = translation.positional_scores
            assert len(scores) == len(translation.tokens) + 1 and all(s <= 0 for s in scores)
            assert sum(scores) / len(scores) ** lenpen == pytest.approx(translation.score, abs=1e-4)
            assert [t for _, t in translation.alignment] == list(range(len(translation.tokens)))
            assert all(0 <= s < len(source) - 1 for s, _ in translation.alignment)
            diagonal += sum(s == t for s, t in translation.alignment)
            total += len(translation.alignment)
    # The toy task translates word for word in order: the attention must find that.
    assert diagonal / total > 0.75


def test_translate_takes_one_sentence_as_a_str(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    assert translator.translate("dog") == "hund"  # not one translation per character
    assert translator.translate("dog\n") == "hund"
    assert [t.text for t in translator.translate_nbest("dog", beam=2, nbest=2)[0]][0] == "hund"
    with pytest.raises(ValueError, match="one sentence"):
        translator.translate("dog\ncat")
    with pytest.raises(TypeError, match="holding bytes"):
        translator.translate([b"dog"])

"""Lexically constrained beam search: exhaustive optimum under constraints, term success, the CLI."""

from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest
import torch

from nmt.config import EvalConfig
from nmt.data.spm import EOS_ID
from nmt.eval import Translator, generate
from nmt.eval import search as search_module
from nmt.eval.constraints import dynamic_beam_order
from nmt.eval.ensemble import Ensemble
from nmt_cli.eval import main

from ..helpers import TINY_MODEL_WORDS, WORTE, run_cli
from .test_search import VOCAB, padded, random_model, teacher_forced_scores


def occurs(tokens: list[int], phrase: list[int], *, after: int = -1) -> int:
    """End (exclusive) of the first occurrence of ``phrase`` in ``tokens`` ending after ``after``; -1 if none."""
    for end in range(max(len(phrase), after + 1), len(tokens) + 1):
        if tokens[end - len(phrase) : end] == phrase:
            return end
    return -1


def satisfies(tokens: list[int], phrases: list[list[int]], *, ordered: bool) -> bool:
    """Every phrase occurs; ``ordered``: each one ends after the previous one ended."""
    if not ordered:
        return all(occurs(tokens, phrase) >= 0 for phrase in phrases)
    end = -1
    for phrase in phrases:
        end = occurs(tokens, phrase, after=end)
        if end < 0:
            return False
    return True


CONSTRAINT_SETS = [
    [[4]],
    [[5, 4]],  # two pieces
    [[3], [5]],
    [[4, 5], [5, 3]],  # overlapping: "4 5 3" meets both within 3 tokens
    [[4], [4, 5]],  # one phrase the start of another
    [[5], [5]],  # the same phrase twice: one occurrence meets both
]


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("phrases", CONSTRAINT_SETS)
@pytest.mark.parametrize("lenpen,seed", [(1.0, 0), (0.0, 1), (2.0, 2)])
def test_constrained_beam_finds_the_best_satisfying_sequences_of_exhaustive_search(
    phrases: list[list[int]], ordered: bool, lenpen: float, seed: int
) -> None:
    model = random_model(vocab_size=VOCAB, seed=seed)
    source = [4, 5, 4, 3, EOS_ID]
    pieces = [3, 4, 5]
    outputs = [
        list(seq) + [EOS_ID] for n in (1, 2, 3) for seq in itertools.product(pieces, repeat=n)
    ]
    scores = teacher_forced_scores(model, source, outputs, lenpen=lenpen)
    expected = sorted(
        (score, out)
        for score, out in zip(scores, outputs)
        if satisfies(out[:-1], phrases, ordered=ordered)
    )[::-1]
    assert expected, "every set here has outputs within 3 tokens that meet it"
    cfg = EvalConfig(beam=len(outputs) + 1, nbest=5, max_len_a=0.0, max_len_b=3, lenpen=lenpen)
    src, src_lengths = padded([source])
    (found,) = generate(
        model, src, src_lengths, cfg, constraints=[phrases], ordered_constraints=ordered
    )
    num_expected = min(5, len(expected))
    assert [h.tokens + [EOS_ID] for h in found[:num_expected]] == [
        out for _, out in expected[:num_expected]
    ]
    np.testing.assert_allclose(
        [h.score for h in found[:num_expected]],
        [score for score, _ in expected[:num_expected]],
        rtol=1e-5,
        atol=1e-5,
    )
    # Fewer satisfying outputs than nbest: the rest could not meet them, and rank after.
    assert all(not satisfies(h.tokens, phrases, ordered=ordered) for h in found[num_expected:])


@pytest.mark.parametrize("beam", [1, 2, 4])
def test_small_beams_meet_every_constraint_the_length_allows(beam: int) -> None:
    """A random model never wants the constraints; a small beam still meets them all (DBA keeps
    the hypotheses with the most constraint pieces), in a batch of sentences with 0 to 3 phrases."""
    model = random_model(vocab_size=12, seed=4)
    sources, phrases = random_batch(vocab_size=12, seed=0)
    src, src_lengths = padded(sources)
    for ordered in (False, True):
        cfg = EvalConfig(beam=beam, nbest=1, max_len_a=0.0, max_len_b=12)
        found = generate(
            model, src, src_lengths, cfg, constraints=phrases, ordered_constraints=ordered
        )
        for sentence_phrases, (best,) in zip(phrases, found):
            assert satisfies(best.tokens, sentence_phrases, ordered=ordered)


def random_batch(
    *, vocab_size: int, seed: int, size: int = 12
) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Sources of 2-6 pieces and 0-3 constraint phrases of 1-3 pieces each."""
    rng = random.Random(seed)
    sources, phrases = [], []
    for _ in range(size):
        sources.append([rng.randrange(3, vocab_size) for _ in range(rng.randint(2, 6))] + [EOS_ID])
        phrases.append(
            [
                [rng.randrange(3, vocab_size) for _ in range(rng.randint(1, 3))]
                for _ in range(rng.randint(0, 3))
            ]
        )
    return sources, phrases


# lenpen 2 favours long outputs so much that no active hypothesis is ever out of the race.
@pytest.mark.parametrize("lenpen,saves", [(0.0, True), (1.0, True), (-0.5, True), (2.0, False)])
def test_stopping_once_no_active_hypothesis_can_win_changes_nothing_but_the_steps(
    tiny, lenpen: float, saves: bool, monkeypatch
) -> None:
    """A sentence stops when its nbest finished hypotheses met their constraints and outscore what
    any active one can still reach: the same hypotheses and scores as waiting for K finished
    ones, with fewer decoder rows."""
    translator = Translator.from_checkpoint(tiny.checkpoint)
    constraints = misses(translator, tiny.test_src, seed=1)
    rows = []
    next_log_probs = Ensemble.next_log_probs

    def counted(self, tokens, *args, **kwargs):
        rows[-1] += tokens.shape[0]
        return next_log_probs(self, tokens, *args, **kwargs)

    monkeypatch.setattr(Ensemble, "next_log_probs", counted)

    def search() -> list[list[tuple[list[int], float]]]:
        rows.append(0)
        found = translator.translate_nbest(
            tiny.test_src, constraints=constraints, beam=4, nbest=2, lenpen=lenpen
        )
        return [[(t.tokens, t.score) for t in nbest] for nbest in found]

    early = search()
    monkeypatch.setattr(
        search_module._Finished, "settled", lambda self, sentences, *a, **k: sentences < 0
    )
    waited = search()
    assert [[t for t, _ in n] for n in early] == [[t for t, _ in n] for n in waited]
    np.testing.assert_allclose(
        [s for n in early for _, s in n], [s for n in waited for _, s in n], rtol=1e-6
    )
    assert rows[0] < rows[1] if saves else rows[0] == rows[1]


def test_dynamic_beam_order_takes_the_banks_in_turn() -> None:
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0, -torch.inf]])
    banks = torch.tensor([[0, 0, 2, 1, 2, 2]])
    # Best of bank 2, of 1, of 0; then second best of 2, of 0; the -inf candidate last.
    assert dynamic_beam_order(scores, banks, num_banks=3).tolist() == [[2, 3, 0, 4, 1, 5]]


def misses(translator: Translator, sources: list[str], *, seed: int) -> list[list[str]]:
    """Per sentence, 1-2 target words the unconstrained beam does not output (the papers' setup)."""
    rng = random.Random(seed)
    plain = translator.translate(sources, beam=4)
    return [
        rng.sample(
            [w for w in WORTE[:TINY_MODEL_WORDS] if w not in output.split()], rng.randint(1, 2)
        )
        for output in plain
    ]


def test_tiny_model_term_success_is_total_and_batching_does_not_change_it(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    constraints = misses(translator, tiny.test_src, seed=0)
    nbest = translator.translate_nbest(
        tiny.test_src, constraints=constraints, beam=4, nbest=2, max_len_a=1.5, max_len_b=10
    )
    for words, translations in zip(constraints, nbest):
        for translation in translations:
            assert all(word in translation.text.split() for word in words), (words, translation)
    one_by_one = translator.translate_nbest(
        tiny.test_src,
        constraints=constraints,
        beam=4,
        nbest=2,
        max_len_a=1.5,
        max_len_b=10,
        batch_size=1,
    )
    assert [[t.tokens for t in n] for n in nbest] == [[t.tokens for t in n] for n in one_by_one]
    np.testing.assert_allclose(
        [t.score for n in nbest for t in n], [t.score for n in one_by_one for t in n], rtol=1e-4
    )
    # One sentence as a str takes its own list of phrases; no constraint is the plain search.
    assert "katze" in translator.translate(tiny.test_src[0], constraints=["katze"]).split()
    # Sentences without constraints, in a batch with constrained ones, translate as without any.
    some = [words if index % 3 == 0 else [] for index, words in enumerate(constraints)]
    mixed = translator.translate(tiny.test_src, constraints=some)
    plain = translator.translate(tiny.test_src)
    assert [m for m, c in zip(mixed, some) if not c] == [p for p, c in zip(plain, some) if not c]
    assert translator.translate(tiny.test_src, constraints=[[]] * len(tiny.test_src)) == plain
    # An empty line is decoded when it has constraints (and stays empty when it has none).
    assert translator.translate(["", ""], constraints=[["rot"], []]) == ["rot", ""]


def test_api_errors(tiny) -> None:
    translator = Translator.from_checkpoint(tiny.checkpoint)
    with pytest.raises(ValueError, match="constraints of sentence 2: constraint 1 is empty"):
        translator.translate(["a", "b"], constraints=[["x"], ["  "]])
    with pytest.raises(ValueError, match="--constraints: beam search only, not with --sampling"):
        translator.translate(["a"], constraints=[["x"]], sampling=True)
    with pytest.raises(TypeError, match="a sequence of phrases"):
        translator.translate(["a"], constraints=["x"])


run = functools.partial(run_cli, main)


def test_cli_reads_constraints_after_tabs(tiny, capsys, monkeypatch) -> None:
    sources = tiny.test_src[:4]
    constraints = [["katze", "ball"], [], ["rot"], ["der hund"]]
    lines = ["\t".join([source, *words]) for source, words in zip(sources, constraints)]
    stdin = ("\n".join(lines) + "\n").encode()
    for order in ("unordered", "ordered"):
        code, out, err = run(
            ["--path", tiny.checkpoint, "--constraints", order, "--beam", "4", "--cpu"],
            capsys=capsys,
            monkeypatch=monkeypatch,
            stdin=stdin,
        )
        assert code == 0, err
        expected = Translator.from_checkpoint(tiny.checkpoint).translate(
            sources, constraints=constraints, beam=4, ordered_constraints=order == "ordered"
        )
        assert out.split("\n")[:-1] == expected
        for output, words in zip(expected, constraints):
            assert all(word in output for word in words)


@pytest.mark.parametrize(
    "argv_tail,stdin,message",
    [
        ([], b"the dog\tkatze\nthe cat\t\n", "<stdin>:2: constraint 1 is empty"),
        (["--buffer-size", "1"], b"the dog\tkatze\n\ta\t \n", "<stdin>:2: constraint 2 is empty"),
        (["--sampling"], b"the dog\tkatze\n", "--constraints: beam search only"),
        (["--score-reference", "--reference", "{ref}"], b"the dog\tkatze\n", "--score-reference"),
        (["{data}"], b"", "give --input text (or stdin), not DATA_DIR"),
    ],
)
def test_cli_errors_are_one_line(
    tiny, tmp_path, capsys, monkeypatch, argv_tail, stdin, message
) -> None:
    reference = tmp_path / "ref"
    reference.write_text("der hund\n", encoding="utf-8")
    tail = [a.format(ref=reference, data=tiny.data_dir) for a in argv_tail]
    code, out, err = run(
        ["--path", tiny.checkpoint, "--constraints", "unordered", "--cpu", *tail],
        capsys=capsys,
        monkeypatch=monkeypatch,
        stdin=stdin,
    )
    # Line by line (--buffer-size 1), the lines before the bad one are out already.
    assert code == 1 and (out == "" or "--buffer-size" in argv_tail)
    assert err.strip().startswith("nmt-eval: error:") and message in err
    assert len(err.strip().split("\n")) == 1, err


def test_cli_refuses_constraints_with_a_ctranslate2_export(tiny, tmp_path, capsys, monkeypatch):
    pytest.importorskip("ctranslate2")
    from nmt.deploy.ct2 import export_ctranslate2

    export = str(tmp_path / "ct2")
    export_ctranslate2([tiny.checkpoint], export)
    code, _, err = run(
        ["--path", export, "--constraints", "ordered"],
        capsys=capsys,
        monkeypatch=monkeypatch,
        stdin=b"the dog\tkatze\n",
    )
    assert code == 1
    assert "CTranslate2 export, which has no lexical constraints" in err
    assert len(err.strip().split("\n")) == 1, err

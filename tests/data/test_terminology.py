"""Terminology: training annotation on ids (deterministic, world-size invariant, within budget)
and glossaries matched on text."""

import random

import numpy as np
import pytest

from nmt.config import BatchingConfig, DataConfig, PreprocessConfig
from nmt.data import preprocess as preprocess_module
from nmt.data.manifest import load_manifest
from nmt.data.plan import TrainingDataPlan
from nmt.data.spm import EOS_ID, TERM_TAG, UNK_ID, SentencePieceModel, reserved_tags
from nmt.data.terminology import (
    MAX_ADDED_TOKENS,
    MAX_PHRASE_PIECES,
    Glossary,
    append_terms,
    draw_phrases,
    mask_words,
    word_starts,
)

from ..helpers import random_pairs, write_corpus

MAX_TOKENS = 256


def plan_for(
    data_dir, *, rate=0.5, mask=0.0, world_size=1, rank=0, update_freq=1, num_workers=0, **batching
):
    return TrainingDataPlan(
        DataConfig(
            data_dir=data_dir,
            term_annotation_rate=rate,
            term_mask_rate=mask,
            num_workers=num_workers,
            batching=BatchingConfig(
                layout="padded", max_tokens=MAX_TOKENS, update_freq=update_freq, **batching
            ),
        ),
        seed=3,
        rank=rank,
        world_size=world_size,
    )


def spm_of(data_dir):
    manifest = load_manifest(data_dir)
    return SentencePieceModel.load(manifest.path(manifest.spm.src_model))


def samples_of(update):
    """The (source, target) token tuples of an update's real micro-batches, padding removed."""
    found = []
    for micro in update.micro_batches:
        if micro.dummy:
            continue
        batch = micro.batch
        for row, length in enumerate(batch["src_lengths"].tolist()):
            source = tuple(batch["src_tokens"][row, :length].tolist())
            target = tuple(t for t in batch["target"][row].tolist() if t != 0)
            found.append((source, target))
    return found


def epoch_samples(plan):
    plan.begin_epoch()
    return [samples_of(update) for update in plan.updates()]


def contains(sequence, part):
    n = len(part)
    return any(tuple(sequence[i : i + n]) == tuple(part) for i in range(len(sequence) - n + 1))


def split_annotation(source, tag):
    """(the source without its terms, the terms) of an annotated source (EOS last)."""
    source = list(source)
    if tag not in source:
        return source, []
    first = source.index(tag)
    terms, current = [], None
    for piece in source[first:-1]:
        if piece == tag:
            current = []
            terms.append(current)
        else:
            current.append(piece)
    return source[:first] + source[-1:], terms


def test_the_term_tag_is_reserved_in_every_new_vocabulary(tiny_data):
    assert TERM_TAG in reserved_tags(["en", "de"])
    assert TERM_TAG in spm_of(tiny_data).tags
    # a control symbol: typed text never becomes the tag
    assert spm_of(tiny_data).tags[TERM_TAG] not in spm_of(tiny_data).encode(["<term> x"])[0]


def test_drawn_phrases_are_whole_words_of_the_reference_within_the_room(tiny_data):
    spm = spm_of(tiny_data)
    starts = word_starts(spm)
    target = np.array(spm.encode(["der hund sitzt auf einer matte im haus"])[0] + [EOS_ID])
    counts = set()
    for seed in range(200):
        room = 4 + seed % 13
        wanted = 1 + seed % 2
        phrases = draw_phrases(target, starts, random.Random(seed), wanted=wanted, room=room)
        counts.add(len(phrases))
        assert len(phrases) <= wanted and sum(len(p) + 1 for p in phrases) <= room
        assert all(len(phrase) <= MAX_PHRASE_PIECES for phrase in phrases)
        positions = []
        for phrase in phrases:
            assert starts[phrase[0]], "a phrase begins a word"
            assert EOS_ID not in phrase.tolist()
            words = spm.decode([phrase.tolist()])[0].split()
            assert 1 <= len(words) <= 3
            begin = next(
                i
                for i in range(len(target))
                if target[i : i + len(phrase)].tolist() == phrase.tolist()
            )
            end = begin + len(phrase)
            assert end == len(target) - 1 or starts[target[end]], "a phrase ends a word"
            positions.append((begin, end))
        positions.sort()
        assert all(a[1] <= b[0] for a, b in zip(positions, positions[1:])), "no overlap"
    assert counts == {1, 2}


def test_append_terms_puts_each_term_after_the_tag_before_eos():
    source = np.array([7, 8, EOS_ID])
    annotated = append_terms(source, [[20, 21], [30]], tag=5)
    assert annotated.tolist() == [7, 8, 5, 20, 21, 5, 30, EOS_ID]
    assert append_terms(source, [], tag=5) is source


def test_a_share_of_training_sources_carry_reference_phrases_within_the_budget(tiny_data):
    tag = spm_of(tiny_data).tags[TERM_TAG]
    plan = plan_for(tiny_data, rate=0.5)
    dataset = plan.current.dataset
    lengths_bound = np.asarray(dataset.src_lengths)
    annotated = 0
    for i in range(len(dataset)):
        source, target = dataset[i]
        plain, terms = split_annotation(source.tolist(), tag)
        original_source, original_target = dataset.corpus[i]
        assert plain == original_source.tolist() and target.tolist() == original_target.tolist()
        assert len(source) <= lengths_bound[i]
        assert len(source) - len(original_source) <= MAX_ADDED_TOKENS
        if terms:
            annotated += 1
            assert 1 <= len(terms) <= 2
            assert all(term and contains(target.tolist(), term) for term in terms)
    assert 0.4 < annotated / len(dataset) < 0.6
    for samples in epoch_samples(plan):
        for source, _ in samples:
            assert source.count(tag) <= 2
    for update in plan_for(tiny_data).updates():
        for micro in update.micro_batches:  # padded cost within the budget, tags counted
            assert micro.batch["src_tokens"].numel() <= MAX_TOKENS
            # the logged padding counts what was drawn, not the bound batching made room for
            source_tokens = int((micro.batch["src_tokens"] != 0).sum())
            target_tokens = int((micro.batch["target"] != 0).sum())
            assert micro.real_tokens == source_tokens + target_tokens <= micro.padded_tokens
    assert not any(tag in dataset.corpus[i][0].tolist() for i in range(len(dataset)))


def test_mask_words_replaces_whole_words_and_keeps_tags_and_eos(tiny_data):
    spm = spm_of(tiny_data)
    starts = word_starts(spm)
    tag = spm.tags[TERM_TAG]  # stands for a language tag before the first word
    source = np.array([tag, *spm.encode(["der hundeschlitten sitzt auf matten"])[0], EOS_ID])
    words = np.cumsum(starts[source]) - 1  # the word index of each piece (-1: before the first)
    seen = set()
    for seed in range(100):
        masked = mask_words(source, starts, random.Random(seed), rate=0.5)
        assert masked.shape == source.shape and masked[0] == tag and masked[-1] == EOS_ID
        changed = masked != source
        assert (masked[changed] == UNK_ID).all()
        for word in range(words.max() + 1):  # a word is masked whole or not at all
            assert len(set(changed[1:-1][words[1:-1] == word].tolist())) == 1
        seen.add(int(changed.sum() > 0))
    assert seen == {0, 1}
    assert mask_words(source, starts, random.Random(0), rate=0.0) is source


def test_masking_touches_only_annotated_sources_at_about_its_rate(tiny_data):
    tag = spm_of(tiny_data).tags[TERM_TAG]
    dataset = plan_for(tiny_data, rate=0.5, mask=0.4).current.dataset
    unmasked = plan_for(tiny_data, rate=0.5).current.dataset
    masked_pieces = pieces = 0
    for i in range(len(dataset)):
        source, target = dataset[i]
        plain, terms = split_annotation(source.tolist(), tag)
        same_draw, _ = unmasked[i]
        assert split_annotation(same_draw.tolist(), tag)[1] == terms, "the same phrases"
        original = dataset.corpus[i][0].tolist()
        assert target.tolist() == dataset.corpus[i][1].tolist()
        if not terms:
            assert plain == original
            continue
        assert len(plain) == len(original)
        for kept, was in zip(plain, original):
            assert kept in (was, UNK_ID)
        pieces += len(original) - 1
        masked_pieces += sum(a != b for a, b in zip(plain, original))
    assert 0.25 < masked_pieces / pieces < 0.55


def test_rate_zero_leaves_the_plan_as_it_was(tiny_data):
    plain = TrainingDataPlan(
        DataConfig(data_dir=tiny_data, batching=BatchingConfig(layout="padded", max_tokens=256)),
        seed=3,
    )
    assert epoch_samples(plan_for(tiny_data, rate=0.0)) == epoch_samples(plain)


@pytest.mark.parametrize("world_size,update_freq", [(2, 1), (3, 2)])
def test_annotated_batches_are_the_same_for_any_world_size(tiny_data, world_size, update_freq):
    one = epoch_samples(plan_for(tiny_data, update_freq=world_size * update_freq))
    ranks = [
        epoch_samples(plan_for(tiny_data, world_size=world_size, rank=r, update_freq=update_freq))
        for r in range(world_size)
    ]
    assert all(len(r) == len(one) for r in ranks)
    for k, samples in enumerate(one):
        assert sorted(s for r in ranks for s in r[k]) == sorted(samples)


def test_data_loader_workers_annotate_as_the_main_process_does(tiny_data):
    assert epoch_samples(plan_for(tiny_data, num_workers=1)) == epoch_samples(plan_for(tiny_data))


def test_resume_and_epochs(tiny_data):
    tag = spm_of(tiny_data).tags[TERM_TAG]
    reference = epoch_samples(plan_for(tiny_data))
    plan = plan_for(tiny_data)
    plan.begin_epoch()
    updates = plan.updates()
    for _ in range(3):
        next(updates)
    resumed = plan_for(tiny_data)
    resumed.load_state_dict(plan.state_dict())
    assert epoch_samples(resumed) == reference[3:]

    def annotated(plan):
        dataset = plan.current.dataset
        return {i for i in range(len(dataset)) if tag in dataset[i][0].tolist()}

    first = plan_for(tiny_data)
    second = plan_for(tiny_data)
    second.load_state_dict({"epoch": 1, "epoch_start_update": 0, "updates_done": 0})
    assert annotated(first) != annotated(second), "each epoch draws its own samples"


def test_a_dataset_without_the_tag_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(
        preprocess_module,
        "reserved_tags",
        lambda languages: [t for t in reserved_tags(languages) if t != TERM_TAG],
    )
    src, tgt = random_pairs(40, seed=0)
    prefix = write_corpus(str(tmp_path), "train", src, tgt)
    preprocess_module.preprocess(
        PreprocessConfig(
            source_lang="en",
            target_lang="de",
            trainpref=[prefix],
            destdir=str(tmp_path / "old"),
            spm_vocab_size=40,
            workers=1,
        )
    )
    with pytest.raises(ValueError) as error:
        plan_for(str(tmp_path / "old"))
    message = str(error.value)
    assert "\n" not in message
    assert "--term-annotation-rate" in message and str(tmp_path / "old") in message
    assert "nmt-preprocess" in message


def test_the_rates_are_shares_and_masking_needs_annotation():
    with pytest.raises(ValueError, match="--term-annotation-rate: must be in"):
        DataConfig(data_dir="x", term_annotation_rate=1.5)
    with pytest.raises(ValueError, match="--term-mask-rate: must be in"):
        DataConfig(data_dir="x", term_annotation_rate=0.5, term_mask_rate=1.0)
    with pytest.raises(ValueError, match="--term-mask-rate: masks the samples"):
        DataConfig(data_dir="x", term_mask_rate=0.3)


# ----------------------------------------------------------------------------- glossaries
def test_glossary_matches_whole_words_case_sensitively_longest_first():
    glossary = Glossary({"cat": "Katze", "black cat": "Rappenkatze", "Apple": "Apple Inc."})
    assert glossary.matches("the black cat sees a cat") == [("black cat", "Rappenkatze")] + [
        ("cat", "Katze")
    ]
    assert glossary.matches("cats and a bobcat") == []
    assert glossary.matches("an apple, an Apple.") == [("Apple", "Apple Inc.")]
    assert Glossary({}).matches("cat") == []
    with pytest.raises(ValueError, match="^glossary: entry '': empty source term$"):
        Glossary({"": "Katze"})


def test_glossary_file_errors_name_the_line(tmp_path):
    path = tmp_path / "terms.tsv"
    path.write_text("cat\tKatze\n\ndog\tHund\n", encoding="utf-8")
    assert Glossary.read(str(path)).entries == {"cat": "Katze", "dog": "Hund"}
    for text, line, reason in (
        ("cat\tKatze\ndog Hund\n", 2, "expected 'source term<TAB>target term'"),
        ("cat\t\n", 1, "empty target term"),
        ("cat\tKatze\ncat\tMieze\n", 2, "already on line 1"),
        ("a\tb\tc\n", 1, "3 tab-separated fields"),
    ):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError) as error:
            Glossary.read(str(path))
        assert str(error.value).startswith(f"{path}:{line}: ") and reason in str(error.value)
    path.write_bytes(b"cat\t\xffKatze\n")
    with pytest.raises(ValueError, match=f"{path}:1: invalid UTF-8"):
        Glossary.read(str(path))
    with pytest.raises(ValueError, match="missing.tsv"):
        Glossary.read(str(tmp_path / "missing.tsv"))

"""Multilingual preprocessing (nmt-preprocess --lang-pairs) and the direction corpora training reads:
each language side encoded once, tags reserved, per-pair files, and one line for each bad input."""

import gzip
import os
import shutil

import numpy as np
import pytest

from nmt.config import DataConfig, PreprocessConfig
from nmt.data.corpus import ParallelCorpus
from nmt.data.directions import TaggedCorpus, open_directions
from nmt.data.groups import language_shares
from nmt.data.manifest import load_manifest, verify_checksums
from nmt.data.plan import TrainingDataPlan
from nmt.data.preprocess import preprocess
from nmt.data.spm import SentencePieceModel, language_tag
from nmt_cli.preprocess import main as preprocess_main

from ..helpers import MULTI_PAIRS, run_torchrun, write_multiway


def test_each_language_side_is_encoded_once(multi_data):
    manifest = load_manifest(multi_data)
    assert manifest.lang_pairs == ("en-de", "de-en", "en-fr", "fr-en")
    for split in ("train", "valid", "test"):
        bins = sorted(
            name
            for name in os.listdir(multi_data)
            if name.startswith(f"{split}.") and name.endswith(".bin")
        )
        # 4 directions over 3 languages: 3 token files, not 8
        assert bins == [f"{split}.de.bin", f"{split}.en.bin", f"{split}.fr.bin"]
        prefixes = {
            pair: (entry.parts[0].src.prefix, entry.parts[0].tgt.prefix)
            for pair, entry in (
                (pair, manifest.split(name))
                for pair, name in manifest.direction_splits(split).items()
            )
        }
        assert prefixes == {
            "en-de": (f"{split}.en", f"{split}.de"),
            "de-en": (f"{split}.de", f"{split}.en"),
            "en-fr": (f"{split}.en", f"{split}.fr"),
            "fr-en": (f"{split}.fr", f"{split}.en"),
        }
    en_de = ParallelCorpus(multi_data, "train.en-de")
    de_en = ParallelCorpus(multi_data, "train.de-en")
    assert len(en_de) == len(de_en) == 400
    np.testing.assert_array_equal(en_de[7][0], de_en[7][1])  # the same English tokens, read twice


def test_tags_are_reserved_and_text_never_encodes_to_them(multi_data):
    manifest = load_manifest(multi_data)
    spm = SentencePieceModel.load(os.path.join(multi_data, "spm.model"))
    assert {language_tag(lang) for lang in ("en", "de", "fr")} <= set(manifest.tags)
    assert {tag: spm.tags[tag] for tag in manifest.tags} == manifest.tags
    ids = spm.encode(["<2de> the dog <2fr>"])[0]
    assert not set(ids) & set(manifest.tags.values())


def test_directions_carry_their_tag_on_the_chosen_side(multi_data):
    manifest = load_manifest(multi_data)
    plain = ParallelCorpus(multi_data, "train.en-fr")
    encoder = open_directions(manifest, "train", placement="encoder")["en-fr"]
    decoder = open_directions(manifest, "train", placement="decoder")["en-fr"]
    tag = manifest.tags["<2fr>"]
    src, tgt = plain[3]
    np.testing.assert_array_equal(encoder[3][0], np.concatenate([[tag], src]))
    np.testing.assert_array_equal(encoder[3][1], tgt)
    np.testing.assert_array_equal(decoder[3][1], np.concatenate([[tag], tgt]))
    np.testing.assert_array_equal(encoder.src_lengths, np.asarray(plain.src_lengths) + 1)
    np.testing.assert_array_equal(decoder.tgt_lengths, np.asarray(plain.tgt_lengths) + 1)


def test_training_plan_blends_every_direction_by_temperature(multi_data):
    plan = TrainingDataPlan(DataConfig(data_dir=multi_data, sampling_temperature=5.0), seed=1)
    assert plan.corpus_names == [f"train.{pair}" for pair in MULTI_PAIRS.split(",")]
    assert all(isinstance(corpus, TaggedCorpus) for corpus in plan.corpora)
    assert list(plan.valid_sets) == MULTI_PAIRS.split(",")
    info = plan.begin_epoch()
    counts = [info.blend_counts[f"train.{pair}_samples"] for pair in MULTI_PAIRS.split(",")]
    assert counts == [400] * 4  # equal sizes: equal shares at any temperature
    micro = next(plan.updates()).micro_batches[0]
    tags = load_manifest(multi_data).tags
    sources = [plan.current.dataset[int(i)][0] for i in micro.indices]
    # the encoder reads the target tag first, and all three target languages come up
    assert {int(source[0]) for source in sources} == {tags["<2de>"], tags["<2en>"], tags["<2fr>"]}
    plan.close()


def test_upsampled_directions_get_their_factor_of_each_epoch(multi_data, tiny_data):
    def counts(**options):
        plan = TrainingDataPlan(DataConfig(data_dir=multi_data, **options), seed=1)
        info = plan.begin_epoch()
        plan.close()
        return [info.blend_counts[f"train.{pair}_samples"] for pair in MULTI_PAIRS.split(",")]

    # 4 equal directions, 1,600 samples an epoch: shares 3 (en-de), 1, 1 and 1.5 (fr-en) of 6.5
    assert counts(upsample_directions="en-de:3,fr-en:1.5") == [739, 246, 246, 369]
    # on top of --sampling-temperature (equal sizes: equal before the factor)
    assert counts(upsample_directions="en-fr:2", sampling_temperature=5.0) == [320, 320, 640, 320]
    with pytest.raises(ValueError) as unknown:
        TrainingDataPlan(DataConfig(data_dir=multi_data, upsample_directions="en-cs:2"), seed=1)
    assert str(unknown.value) == (
        f"--upsample-directions en-cs: {multi_data} has no such direction "
        "(has: en-de, de-en, en-fr, fr-en)"
    )
    # A bilingual dataset is the one-direction case: its direction is known, no other.
    with pytest.raises(ValueError, match=r"--upsample-directions de-en: .* \(has: en-de\)$"):
        TrainingDataPlan(DataConfig(data_dir=tiny_data, upsample_directions="de-en:2"), seed=1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("en-de", "'en-de' is not PAIR:FACTOR"),
        ("en-de:0", "'en-de:0' is not PAIR:FACTOR with a factor > 0"),
        ("en-de:-1", "'en-de:-1' is not PAIR:FACTOR"),
        ("en-de:nan", "'en-de:nan' is not PAIR:FACTOR"),
        ("ende:2", "'ende:2' is not PAIR:FACTOR"),
        ("en-de:2,", "'' is not PAIR:FACTOR"),
        ("en-de:2,en-de:3", "en-de is given twice"),
        ("en-de:1e-320", "'en-de:1e-320': the factor must lie between 0.001 and 1000"),
        ("en-de:2,en-fr:1e300", "'en-fr:1e300': the factor must lie between"),
    ],
)
def test_bad_upsample_directions_are_one_clear_line(text, message):
    with pytest.raises(ValueError, match=f"^--upsample-directions: {message}"):
        DataConfig(data_dir="d", upsample_directions=text)


def test_language_shares_flatten_with_temperature():
    shares = language_shares({"en": 10_000, "cs": 100}, 5.0)
    assert shares["cs"] == pytest.approx(100**0.2 / (100**0.2 + 10_000**0.2))
    assert language_shares({"en": 10_000, "cs": 100}, 1.0)["cs"] == pytest.approx(100 / 10_100)


def test_per_pair_files_in_fairseq_naming(tmp_path):
    """P.SRC-TGT.LANG files: de-en reads the en-de files, each pair's text encoded once."""
    for pair in ("en-de", "en-fr"):
        write_multiway(tmp_path, f"train.{pair}", 60, seed=len(pair) + ord(pair[-1]))
        write_multiway(tmp_path, f"valid.{pair}", 5, seed=3)
    code = preprocess_main(
        [
            "--lang-pairs",
            "en-de,de-en,en-fr",
            "--trainpref",
            str(tmp_path / "train"),
            "--validpref",
            str(tmp_path / "valid"),
            "--destdir",
            str(tmp_path / "data"),
            "--spm-vocab-size",
            "80",
        ]
    )
    assert code == 0
    manifest = load_manifest(str(tmp_path / "data"))
    entry = manifest.split("train.de-en")
    assert (entry.parts[0].src.prefix, entry.parts[0].tgt.prefix) == (
        "train.en-de.de",
        "train.en-de.en",
    )
    bins = sorted(
        name
        for name in os.listdir(tmp_path / "data")
        if name.startswith("train") and name.endswith(".bin")
    )
    assert bins == [
        "train.en-de.de.bin",
        "train.en-de.en.bin",
        "train.en-fr.en.bin",
        "train.en-fr.fr.bin",
    ]
    assert manifest.split("valid.en-fr").reference == "valid.en-fr.ref.fr.gz"


@pytest.fixture()
def raw(tmp_path):
    write_multiway(tmp_path, "train", 30, seed=5)
    write_multiway(tmp_path, "valid", 5, seed=6)
    return tmp_path


@pytest.mark.parametrize(
    "pairs, change, message",
    [
        ("en-de,english-fr", None, "'english' is not a language code"),
        ("en-de,en", None, "'en' is not a pair SRC-TGT"),
        ("en-de,de-en,en-de", None, "'en-de' is listed twice"),
        ("en-en", None, "translates a language into itself"),
        ("en-de,en-cs", None, "train.cs: no such file"),
        ("en-de,en-fr", "short", "has 30 lines but"),
    ],
)
def test_bad_input_is_one_line(raw, capsys, pairs, change, message):
    if change == "short":
        lines = (raw / "train.fr").read_bytes().split(b"\n")
        (raw / "train.fr").write_bytes(b"\n".join(lines[:29]) + b"\n")
    code = preprocess_main(
        [
            "--lang-pairs",
            pairs,
            "--trainpref",
            str(raw / "train"),
            "--validpref",
            str(raw / "valid"),
            "--destdir",
            str(raw / "out"),
            "--spm-vocab-size",
            "60",
        ]
    )
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("nmt-preprocess")]
    assert code == 1 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("nmt-preprocess: error:"), err
    assert message in lines[0]
    assert not os.path.exists(raw / "out")


def _preprocess_de_en(tmp_path, role, capsys):
    """nmt-preprocess --lang-pairs de-en over tmp_path's train (and ROLE) prefix: exit code, stderr lines."""
    options = [f"--{name}pref" for name in dict.fromkeys(["train", role])]
    code = preprocess_main(
        ["--lang-pairs", "de-en", "--destdir", str(tmp_path / "out"), "--spm-vocab-size", "60"]
        + [word for option in options for word in (option, str(tmp_path / option[2:-4]))]
    )
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("role", ["train", "valid", "test"])
@pytest.mark.parametrize(
    "stems",
    [("", "en-de"), ("de-en", ""), ("en-de", "de-en")],
    ids=["multi-way+per-pair", "per-pair+multi-way", "both-pair-orders"],
)
def test_a_direction_in_two_sets_of_files_is_refused(tmp_path, capsys, role, stems):
    """Either set could be the one meant: reading one silently trains or scores on the wrong text."""
    if role != "train":
        write_multiway(tmp_path, "train", 30, seed=5)
    for index, stem in enumerate(stems):
        write_multiway(tmp_path, f"{role}.{stem}" if stem else role, 5, seed=7 + index)
    code, err = _preprocess_de_en(tmp_path, role, capsys)
    prefix = str(tmp_path / role)
    sets = [
        " + ".join(
            f"{prefix}.{stem}.{lang}" if stem else f"{prefix}.{lang}" for lang in ("de", "en")
        )
        for stem in sorted(stems, key=["de-en", "en-de", ""].index)
    ]
    assert code == 1 and len(err) == 1, err
    assert err[0] == (
        f"nmt-preprocess: error: --{role}pref {prefix}: direction de-en is in two sets of files, "
        f"{sets[0]}, and {sets[1]}; keep one set (move the other away, or give --{role}pref a "
        "prefix with only one)"
    )
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("role", ["train", "valid", "test"])
@pytest.mark.parametrize("complete, half", [("", "en-de"), ("de-en", "en-de")])
def test_half_a_per_pair_set_beside_a_complete_set_is_refused(
    tmp_path, capsys, role, complete, half
):
    """P.en-de.en without P.en-de.de beside P.en + P.de: a forgotten file, not a choice."""
    for prefix in dict.fromkeys(["train", role]):
        write_multiway(tmp_path, f"{prefix}.{complete}" if complete else prefix, 30, seed=5)
    write_multiway(tmp_path, f"{role}.{half}", 5, seed=8)
    os.remove(tmp_path / f"{role}.{half}.de")
    code, err = _preprocess_de_en(tmp_path, role, capsys)
    prefix = str(tmp_path / role)
    whole = ".".join(filter(None, [prefix, complete]))
    assert code == 1 and len(err) == 1, err
    assert err[0] == (
        f"nmt-preprocess: error: --{role}pref {prefix}: direction de-en has {prefix}.{half}.en "
        f"without {prefix}.{half}.de (nor .gz/.xz/.zst) beside the complete {whole}.de + "
        f"{whole}.en; complete the per-pair set or move it away"
    )
    assert not os.path.exists(tmp_path / "out")


def test_lang_pairs_refuses_options_it_cannot_honour(raw, capsys):
    code = preprocess_main(
        [
            "--lang-pairs",
            "en-de",
            "-s",
            "en",
            "--trainpref",
            str(raw / "train"),
            "--destdir",
            str(raw / "out"),
        ]
    )
    assert code == 1
    assert "--lang-pairs: names the languages" in capsys.readouterr().err


def test_moved_dataset_still_opens(multi_data, tmp_path):
    moved = shutil.copytree(multi_data, tmp_path / "moved")
    manifest = load_manifest(str(moved))
    assert len(open_directions(manifest, "valid", placement="encoder")) == 4


def test_subset_weights_refused_on_a_multilingual_dataset(multi_data):
    with pytest.raises(ValueError, match="--subset-weights: a multilingual dataset"):
        TrainingDataPlan(DataConfig(data_dir=multi_data, subset_weights=(1.0,)), seed=1)


def _same_directions(single: str, parted: str) -> None:
    """``parted`` reads as ``single``: the same directions, tags and samples, split for split."""
    one, other = load_manifest(single), load_manifest(parted)
    assert (other.lang_pairs, other.tags) == (one.lang_pairs, one.tags)
    assert list(other.splits) == list(one.splits)
    verify_checksums(other)
    for split in one.splits:
        a, b = ParallelCorpus(single, split), ParallelCorpus(parted, split)
        assert len(a) == len(b) > 0
        assert np.array_equal(a.line_numbers, b.line_numbers)
        for i in range(len(a)):
            assert np.array_equal(a[i][0], b[i][0]) and np.array_equal(a[i][1], b[i][1]), (split, i)
        assert one.splits[split].filtered == other.splits[split].filtered


@pytest.fixture(scope="module")
def multi_text(tmp_path_factory):
    """Multi-way train/valid text and per-pair corpora (``extra.en-de.*`` for en-de and de-en,
    ``extra.fr-de.*``), and their single-process dataset."""
    root = tmp_path_factory.mktemp("multi_text")
    write_multiway(root, "train", 301, 5)
    write_multiway(root, "valid", 20, 6)
    for pair, count, seed in (("en-de", 150, 7), ("fr-de", 97, 8)):
        write_multiway(root, "pairs", count, seed)
        for lang in pair.split("-"):
            os.rename(root / f"pairs.{lang}", root / f"extra.{pair}.{lang}")
    options = dict(
        lang_pairs="en-de,de-en,fr-de",
        trainpref=[str(root / "train"), str(root / "extra")],
        validpref=[str(root / "valid")],
        spm_vocab_size=60,
        workers=1,
    )
    preprocess(PreprocessConfig(destdir=str(root / "single"), **options))
    return root, options


def test_a_multilingual_dataset_is_preprocessed_in_shards_and_merged(multi_text):
    root, options = multi_text
    for shard_id in (0, 1):
        preprocess(
            PreprocessConfig(
                destdir=str(root / "merged"),
                num_shards=2,
                shard_id=shard_id,
                merge_parts=True,
                **options,
            )
        )
    merged = load_manifest(str(root / "merged"))
    _same_directions(str(root / "single"), str(root / "merged"))
    assert all(len(entry.parts) == 1 for entry in merged.splits.values())
    # Merged, each language side of a group is still one file that its directions share.
    assert merged.splits["train.en-de"].parts[0].tgt.prefix == "train.de"
    assert merged.splits["train.de-en"].parts[0].src.prefix == "train.de"
    assert merged.splits["train1.de-en"].parts[0].src.prefix == "train1.en-de.de"
    assert merged.splits["train1.fr-de"].parts[0].tgt.prefix == "train1.fr-de.de"
    stored = {n.rsplit(".", 1)[0] for n in os.listdir(root / "merged") if n.endswith(".bin")}
    assert sorted(n for n in stored if n.startswith("train")) == [
        "train.de",
        "train.en",
        "train.fr",
        "train1.en-de.de",
        "train1.en-de.en",
        "train1.fr-de.de",
        "train1.fr-de.fr",
    ]


def test_torchrun_preprocesses_a_multilingual_dataset_one_part_per_rank(multi_text):
    root, options = multi_text
    args = [f"--destdir={root / 'ranks'}", "--spm-vocab-size=60", "--workers=1"]
    args += [f"--lang-pairs={options['lang_pairs']}", f"--validpref={root / 'valid'}"]
    args += [f"--trainpref={root / 'train'},{root / 'extra'}"]
    result = run_torchrun("nmt_cli.preprocess", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = load_manifest(str(root / "ranks"))
    assert [len(entry.parts) for entry in ranks.splits.values()] == [2] * 6 + [1] * 3
    _same_directions(str(root / "single"), str(root / "ranks"))


OLD = os.path.join(os.path.dirname(__file__), "..", "fixtures", "main-0bb72c8")


@pytest.mark.parametrize(
    "name, languages",
    [
        ("en-de", dict(source_lang="en", target_lang="de")),
        ("multi", dict(lang_pairs="en-de,de-en,en-fr")),
    ],
)
def test_the_one_pipeline_writes_the_datasets_main_0bb72c8_wrote(tmp_path, name, languages):
    """Bilingual or multilingual, the same text and options give main 0bb72c8's files, byte for
    byte (its make.sh: the first lines of data/multi30k; its vocabulary given, as today's reserves
    one more tag), and the old dataset opens as directions."""
    data = os.path.join(os.path.dirname(__file__), "..", "..", "data", "multi30k")
    for split, stored, count in (
        ("train", "train", 300),
        ("valid", "val", 30),
        ("test", "test_2016_flickr", 30),
    ):
        for lang in ("en", "de", "fr"):
            with gzip.open(os.path.join(data, f"{stored}.{lang}.gz"), "rt", encoding="utf-8") as f:
                head = [line for _, line in zip(range(count), f)]
            (tmp_path / f"{split}.{lang}").write_text("".join(head), encoding="utf-8")
    manifest, _ = preprocess(
        PreprocessConfig(
            trainpref=[str(tmp_path / "train")],
            validpref=[str(tmp_path / "valid")],
            testpref=[str(tmp_path / "test")],
            destdir=str(tmp_path / "out"),
            spm_model=os.path.join(OLD, name, "spm.model"),
            workers=1,
            **languages,
        )
    )
    old = load_manifest(os.path.join(OLD, name))
    assert manifest.checksums == old.checksums
    assert (manifest.lang_pairs, manifest.tags) == (old.lang_pairs, old.tags)
    assert manifest.splits.keys() == old.splits.keys()
    plan = TrainingDataPlan(DataConfig(data_dir=old.directory), seed=1)
    assert plan.corpus_names == old.training_splits(["train"])
    assert list(plan.valid_sets) == list(old.languages().pairs)
    plan.close()

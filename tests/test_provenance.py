"""One provenance mechanism (nmt.provenance): options declare their identity where they are
declared, identities are collected and compared generically, one line per differing item, and
the records of older code (main 0bb72c8's checkpoint, grouped generation records, parts of a
shard set) still compare as the same run, the same data."""

import dataclasses
import os
import pathlib

import pytest
import torch

from nmt.config import (
    BatchingConfig,
    DataConfig,
    EvalConfig,
    EvalIOConfig,
    ModelConfig,
    PreprocessConfig,
    TrainConfig,
    from_dict,
    to_dict,
)
from nmt.provenance import defaults, differences, identity

OLD = pathlib.Path(__file__).parent / "fixtures" / "main-0bb72c8"


def _train_config(**batching) -> TrainConfig:
    return TrainConfig(data=DataConfig(data_dir="d", batching=BatchingConfig(**batching)))


def _preprocess_config(**options) -> PreprocessConfig:
    return PreprocessConfig(
        destdir="x", source_lang="en", target_lang="de", trainpref=["t"], **options
    )


def test_identity_collects_the_declared_options_of_a_config_tree_by_option_name():
    cfg = _train_config(max_tokens=4096)
    batches = identity(cfg, "batch sequence")
    # from three sections: data, data.batching, run
    assert batches["--max-tokens"] == 4096 and batches["--train-subsets"] == ["train"]
    assert batches["--seed"] == cfg.run.seed
    assert "--lr" not in batches and "--lr" in identity(cfg, "learning-rate schedule")
    model = identity(ModelConfig(), "model")
    assert "--encoder-layers" in model and "--dropout" not in model and "--attention" not in model
    # The generated data's identity leaves out what only concerns the run making it.
    data = identity(_preprocess_config(), "data")
    assert "--spm-vocab-size" in data and "--max-len" in data
    assert not {"--workers", "--shard-id", "--overwrite", "--destdir"} & set(data)
    assert not {"--max-tokens", "--seed"} & set(identity(cfg, "model"))


def test_a_record_gives_the_same_identity_as_its_config():
    cfg = _train_config(max_tokens=777, update_freq=3)
    for scope in ("batch sequence", "optimizer", "learning-rate schedule"):
        assert identity(to_dict(cfg), scope, declared_by=TrainConfig) == identity(cfg, scope)
    preprocess = _preprocess_config(max_len=50)
    record = {**to_dict(preprocess), "an_option_of_another_version": 1}
    assert identity(record, "data", declared_by=PreprocessConfig) == identity(preprocess, "data")


def test_one_line_per_differing_item():
    recorded = identity(_train_config(max_tokens=4096, update_freq=2), "batch sequence")
    current = identity(_train_config(max_tokens=8192, update_freq=2), "batch sequence")
    assert differences(recorded, current, labels=("in the checkpoint", "now")) == [
        "--max-tokens: 4096 in the checkpoint, 8192 now"
    ]
    assert differences(recorded, recorded) == []
    assert differences(recorded, current, free=("--max-tokens",)) == []
    # A fact (no option) gone from one side is a difference too.
    assert differences({"samples in train": 3}, {}) == [
        "samples in train: 3 when recorded, (none) now"
    ]


def test_an_option_added_later_compares_equal_at_its_default_only():
    current = identity(ModelConfig(), "model")
    old = {k: v for k, v in current.items() if k != "--sinusoidal-positions"}
    absent = defaults(ModelConfig, "model")
    assert differences(old, current, absent=absent) == []
    marian = identity(ModelConfig(sinusoidal_positions="marian"), "model")
    assert differences(old, marian, absent=absent, labels=("in the checkpoint", "now")) == [
        "--sinusoidal-positions: 'fairseq' in the checkpoint, 'marian' now"
    ]
    # without the defaults, an absent item is a difference
    assert differences(old, current) == [
        "--sinusoidal-positions: (none) when recorded, 'fairseq' now"
    ]


def test_values_compare_as_declared():
    def upsampled(text):
        cfg = _train_config()
        cfg.data = dataclasses.replace(cfg.data, upsample_directions=text)
        return identity(cfg, "batch sequence")

    assert differences(upsampled("en-de:2, en-fr:1"), upsampled("en-fr:1.0,en-de:2.0")) == []
    assert differences(upsampled("en-de:2"), upsampled("en-de:3")) != []
    # plain values: the config's tuple is the list a checkpoint or a JSON file gives back
    optimizer = identity(_train_config(), "optimizer")
    assert optimizer["--adam-betas"] == [0.9, 0.98]
    assert differences({**optimizer, "--adam-betas": (0.9, 0.98)}, optimizer) == []


def test_the_old_checkpoint_is_the_same_run_and_a_changed_option_is_one_line():
    from nmt.data.manifest import load_manifest
    from nmt.train.checkpoint import check_identity, run_identity

    state = torch.load(OLD / "en-de.checkpoint3.pt", weights_only=True)
    cfg = from_dict(TrainConfig, state["train_config"])
    cfg.data.data_dir = str(OLD / "en-de")
    manifest = load_manifest(str(OLD / "en-de"))
    model_cfg = from_dict(ModelConfig, state["model_config"])
    saved = state["run_identity"]
    # recorded by 0bb72c8 without the options it left out at their defaults
    assert (
        "--sinusoidal-positions" not in saved["model"] and "--lang-tok" not in saved["vocabulary"]
    )
    check_identity("old.pt", saved, run_identity(cfg, model_cfg, manifest), cfg.checkpoint)

    cfg.data.batching.max_tokens = 512
    with pytest.raises(ValueError) as refused:
        check_identity("old.pt", saved, run_identity(cfg, model_cfg, manifest), cfg.checkpoint)
    lines = str(refused.value).splitlines()
    assert lines[1:-1] == [
        "  batch sequence: --max-tokens: 400 in the checkpoint, 512 now (pass --reset-dataloader to "
        "accept it)"
    ]
    cfg.checkpoint.reset_dataloader = True
    check_identity("old.pt", saved, run_identity(cfg, model_cfg, manifest), cfg.checkpoint)


def test_a_generation_record_of_older_code_names_the_same_data():
    from nmt.eval.generate_dataset import GenerationOptions, _identity_differences

    cfg, options = EvalConfig(beam=2), GenerationOptions("train", 16, 0.0, True, False)
    tokens = ["0" * 64]
    current = {
        "model": "sha",
        "input dataset": "/data/mono",
        "input tokens": tokens,
        **identity(cfg, "data"),
        **identity(options, "data", declared_by=EvalIOConfig),
    }
    # as 0bb72c8 wrote it: grouped, by field name, --synthetic-side left out at "source"
    generation = {k: v for k, v in dataclasses.asdict(options).items() if k != "synthetic_side"}
    old = {
        "model": "sha",
        "input": {"dataset": "/elsewhere/mono", "split": "train", "tokens": tokens},
        "search": to_dict(cfg),
        "generation": generation,
    }
    assert _identity_differences(old, current, where="in the dataset") == ""
    old["search"]["beam"] = 5
    assert _identity_differences(old, current, where="in the dataset") == (
        "--beam: 5 in the dataset, 2 now"
    )


def _write(directory: pathlib.Path, name: str, lines: int) -> None:
    for lang, word in (("en", "dog"), ("de", "hund")):
        text = "".join(f"{word} {i} {word}\n" for i in range(lines))
        (directory / f"{name}.{lang}").write_text(text, encoding="utf-8")


def test_parts_of_other_options_are_refused_with_the_option_and_both_values(tmp_path):
    from nmt.data.preprocess import preprocess

    _write(tmp_path, "train", 60)
    common = dict(
        source_lang="en",
        target_lang="de",
        trainpref=[str(tmp_path / "train")],
        spm_vocab_size=30,
        num_shards=2,
    )
    # --workers is each part's own: the parts are one shard set
    same = tmp_path / "same"
    preprocess(PreprocessConfig(**common, destdir=str(same), shard_id=1, workers=2))
    manifest, _ = preprocess(PreprocessConfig(**common, destdir=str(same), shard_id=0, workers=1))
    assert manifest.split("train").num_samples == 60
    assert "workers" not in manifest.config and manifest.config["max_len"] == 256

    other = tmp_path / "other"
    preprocess(PreprocessConfig(**common, destdir=str(other), shard_id=1, max_len=100, workers=1))
    with pytest.raises(ValueError) as refused:
        preprocess(PreprocessConfig(**common, destdir=str(other), shard_id=0, workers=1))
    assert str(refused.value) == (
        f"{os.path.join(other, 'part-00001-of-00002')}: made with other options than part 0 "
        "(--max-len: 256 in part 0, 100 here)"
    )

from ..helpers import parse_log, run_subprocess, train_command


def test_blended_epochs_follow_the_weights_and_change_per_epoch(two_corpus_data, tmp_path):
    args = [
        "--train-subsets",
        "train,train1",
        "--subset-weights",
        "0.75,0.25",
        "--epoch-samples",
        "400",
        "--max-epoch",
        "2",
    ]
    result = run_subprocess(
        [two_corpus_data, *train_command(two_corpus_data, tmp_path / "ck", *args)]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = parse_log(result.stdout, "blend")
    assert [(r["train_samples"], r["train1_samples"]) for r in epochs] == [(300, 100), (300, 100)]
    # train1 has 80 pairs for 100 slots: repeated; its token count is logged too
    assert all(r["train1_tokens"] > 0 for r in epochs)
    assert (tmp_path / "ck" / "blend-cache").is_dir()
    assert parse_log(result.stdout)[-1]["epoch"] == 2


def test_temperature_sampling_and_bad_weights(two_corpus_data, tmp_path):
    result = run_subprocess(
        [
            two_corpus_data,
            *train_command(
                two_corpus_data,
                tmp_path / "t",
                "--train-subsets",
                "train,train1",
                "--sampling-temperature",
                "100",
                "--max-epoch",
                "1",
            ),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = parse_log(result.stdout, "blend")
    # T -> infinity flattens the weights: both corpora get about half of the 580 slots
    assert abs(record["train_samples"] - record["train1_samples"]) < 30
    bad = run_subprocess(
        [
            two_corpus_data,
            *train_command(
                two_corpus_data,
                tmp_path / "b",
                "--train-subsets",
                "train,train1",
                "--subset-weights",
                "1,-1",
            ),
        ]
    )
    assert bad.returncode == 1 and "--subset-weights" in bad.stderr


def test_two_ranks_train_on_the_same_blend_each_building_half(two_corpus_data, tmp_path):
    args = [
        "--train-subsets",
        "train,train1",
        "--subset-weights",
        "0.75,0.25",
        "--epoch-samples",
        "400",
        "--max-epoch",
        "2",
    ]
    result = run_subprocess(
        [two_corpus_data, *train_command(two_corpus_data, tmp_path / "ck", *args)], torchrun_procs=2
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [
        (r["train_samples"], r["train1_samples"]) for r in parse_log(result.stdout, "blend")
    ] == [
        (300, 100),
        (300, 100),
    ]
    parts = sorted(
        path.name.split(".")[1] for path in (tmp_path / "ck" / "blend-cache").glob("*.corpus.npy")
    )
    # Epochs 1 and 2 (and the prefetched 3rd, unless the exit cancelled it), one part per rank.
    assert set(parts) == {"part0of2", "part1of2"} and all(
        parts.count(p) in (2, 3) for p in set(parts)
    ), parts


def test_a_split_of_another_dataset_blends_by_dir_and_split(two_corpus_data, tmp_path):
    """--train-subsets train,DIR/train: a corpus of another dataset directory with the same
    vocabulary (a back-translated one, say) blends like a split of the dataset; another
    vocabulary is one line."""
    import os

    from nmt_cli.preprocess import main as preprocess_main

    raw = os.path.join(os.path.dirname(two_corpus_data), "small")
    spm = os.path.join(two_corpus_data, "spm.model")
    common = ["-s", "en", "-t", "de", "--trainpref", raw, "--workers", "1"]
    assert preprocess_main([*common, "--spm-model", spm, "--destdir", str(tmp_path / "x")]) == 0
    other = str(tmp_path / "x" / "train")
    args = ["--train-subsets", f"train,{other}", "--subset-weights", "0.75,0.25"]
    args += ["--epoch-samples", "400", "--max-epoch", "1"]
    result = run_subprocess(
        [two_corpus_data, *train_command(two_corpus_data, tmp_path / "ck", *args)]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = parse_log(result.stdout, "blend")
    assert (record["train_samples"], record[f"{other}_samples"]) == (300, 100)
    assert parse_log(result.stdout)[-1]["epoch"] == 1
    # another vocabulary (trained on the small corpus alone)
    assert (
        preprocess_main([*common, "--spm-vocab-size", "40", "--destdir", str(tmp_path / "y")]) == 0
    )
    args[1] = f"train,{tmp_path / 'y' / 'train'}"
    bad = run_subprocess([two_corpus_data, *train_command(two_corpus_data, tmp_path / "b", *args)])
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    (line,) = bad.stderr.strip().splitlines()[-1:]
    assert "is not the vocabulary of" in line and line.startswith(
        "nmt-train: error: --train-subsets"
    )

"""nmt-train as a hostile or clumsy user drives it: two runs at once, resuming with other options or
data, a full disk, leftovers of killed saves, fairseq's spellings, broken datasets."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from nmt.checkpoint_io import load_checkpoint

from ..helpers import (
    REVERSAL_PAIRS,
    parse_log,
    process_group,
    run_subprocess,
    tiny_corpus,
    tiny_dataset,
    train_command,
)


def assert_one_line_error(result, *fragments):
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("nmt-train: error:"), last
    for fragment in fragments:
        assert fragment in last, last


def train(data, save_dir, *extra, **kwargs):
    return run_subprocess([data, *train_command(data, save_dir, *extra)], **kwargs)


@contextlib.contextmanager
def running(data, save_dir, *extra):
    """A long nmt-train run that has made its first update (and holds its save dir), stopped at the end."""
    command = [
        sys.executable,
        "-m",
        "nmt_cli.train",
        data,
        *train_command(data, save_dir, "--max-update", "100000", *extra),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with process_group(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    ) as process:
        for line in process.stdout:
            if parse_log(line):
                break
        yield process


def test_a_second_run_on_the_same_save_dir_is_refused_and_a_killed_run_leaves_it_free(
    tiny_data, tmp_path
):
    save_dir = tmp_path / "ck"
    with running(tiny_data, save_dir) as first:
        second = train(tiny_data, save_dir, "--max-update", "2")
        assert_one_line_error(
            second, f"--save-dir {save_dir}: in use by another run (PID {first.pid})"
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    again = train(
        tiny_data, save_dir, "--max-update", "200000", "--max-epoch", "1"
    )  # the kernel dropped the lock
    assert again.returncode == 0, again.stderr[-3000:]


def test_resume_refuses_other_data_and_options_unless_a_reset_flag_accepts_them(
    tiny_data, two_corpus_data, tmp_path
):
    save_dir = tmp_path / "ck"
    assert train(tiny_data, save_dir, "--max-update", "12").returncode == 0

    other_vocabulary = train(two_corpus_data, save_dir, "--max-update", "14")
    assert (
        other_vocabulary.returncode == 1
        and "vocabulary: SentencePiece model spm.model" in other_vocabulary.stderr
    )
    assert "cannot change under the same weights" in other_vocabulary.stderr

    other_batches = train(
        tiny_data, save_dir, "--max-update", "14", "--max-tokens", "512", "--seed", "4"
    )
    assert other_batches.returncode == 1
    assert (
        "batch sequence: --max-tokens: 256 in the checkpoint, 512 now (pass --reset-dataloader"
        in other_batches.stderr
    )
    assert "batch sequence: --seed: 3 in the checkpoint, 4 now" in other_batches.stderr

    other_lr = train(
        tiny_data, save_dir, "--max-update", "14", "--lr", "5", "--lr-scheduler", "fixed"
    )
    assert (
        other_lr.returncode == 1
        and "learning-rate schedule: --lr: 0.003 in the checkpoint, 5.0 now" in other_lr.stderr
    )
    accepted = train(
        tiny_data,
        save_dir,
        "--max-update",
        "14",
        "--lr",
        "5",
        "--lr-scheduler",
        "fixed",
        "--reset-lr-scheduler",
    )
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    assert [r["lr"] for r in parse_log(accepted.stdout)] == [
        5.0,
        5.0,
    ]  # updates 13, 14: past the warm-up of 10
    assert load_checkpoint(str(save_dir / "checkpoint_last.pt"))["num_updates"] == 14

    restarted = train(
        tiny_data,
        save_dir,
        "--max-update",
        "16",
        "--max-tokens",
        "512",
        "--reset-dataloader",
        "--lr",
        "5",
        "--lr-scheduler",
        "fixed",
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert [(r["update"], r["epoch"]) for r in parse_log(restarted.stdout)] == [(15, 1), (16, 1)]


def test_restore_file_starts_a_new_run_from_another_runs_weights(tiny_data, tmp_path):
    first = train(tiny_data, tmp_path / "first", "--max-update", "30")
    assert first.returncode == 0, first.stderr[-3000:]
    fresh = train(tiny_data, tmp_path / "fresh", "--max-update", "1")
    restore = [
        "--restore-file",
        str(tmp_path / "first" / "checkpoint_last.pt"),
        "--reset-optimizer",
        "--reset-dataloader",
        "--reset-meters",
    ]
    tuned = train(tiny_data, tmp_path / "tuned", "--max-update", "31", *restore)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    (record,) = parse_log(tuned.stdout)
    assert record["update"] == 31 and record["loss"] < 0.8 * parse_log(fresh.stdout)[0]["loss"]
    # Once the new run has its own checkpoint_last.pt, it resumes from that, not from the restore file.
    again = train(tiny_data, tmp_path / "tuned", "--max-update", "32", *restore)
    assert again.returncode == 0 and [r["update"] for r in parse_log(again.stdout)] == [32]


def test_a_validation_sentence_longer_than_the_positions_is_truncated_not_fatal(
    long_valid_data, tmp_path
):
    result = train(
        long_valid_data,
        tmp_path / "ck",
        "--max-update",
        "3",
        "--max-source-positions",
        "64",
        "--max-target-positions",
        "64",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 of 10 validation pairs are longer" in result.stderr
    assert any(line.startswith('{"kind": "valid"') for line in result.stdout.splitlines())


@pytest.fixture
def small_disk(tmp_path):
    """A 400 kB file system (tmpfs, when this process may mount one)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount_point)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing_half_written(
    tiny_data, small_disk
):
    save_dir = small_disk / "ck"
    result = train(
        tiny_data,
        save_dir,
        "--max-update",
        "2",
        "--encoder-ffn-embed-dim",
        "512",
        "--decoder-ffn-embed-dim",
        "512",
    )
    assert_one_line_error(result, "disk full", str(save_dir / "checkpoint_last.pt"))
    assert (
        os.listdir(save_dir) == []
    )  # no temporary, no torn checkpoint (the lock file goes with its holder)


def test_an_unwritable_save_dir_is_one_line(tiny_data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert_one_line_error(
        train(tiny_data, blocker / "ck", "--max-update", "1"), str(blocker / "ck")
    )


def test_temporaries_of_killed_saves_are_removed_at_the_next_start(tiny_data, tmp_path):
    save_dir = tmp_path / "ck"
    save_dir.mkdir()
    stale = [save_dir / ".checkpoint_last.pt.tmp-123", save_dir / ".checkpoint_1_4.pt.tmp-99999-2"]
    for path in stale:
        path.write_bytes(b"partial")
    (save_dir / "notes.tmp-1").write_text("not ours: no leading dot")
    result = train(tiny_data, save_dir, "--max-update", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert not any(path.exists() for path in stale) and (save_dir / "notes.tmp-1").exists()


def test_fairseq_interval_flags_count_epochs_and_abbreviations_are_refused(tiny_data, tmp_path):
    abbreviated = train(tiny_data, tmp_path / "a", "--max-update", "1", "--save-int", "1")
    assert (
        abbreviated.returncode == 2 and "unrecognized arguments: --save-int" in abbreviated.stderr
    )
    args = [a for a in train_command(tiny_data, tmp_path / "ck2") if a != "--no-epoch-checkpoints"]
    result = run_subprocess(
        [
            tiny_data,
            *args,
            "--max-epoch",
            "4",
            "--save-interval",
            "2",
            "--validate-interval",
            "2",
            "--keep-last-epochs",
            "1",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    numbered = sorted(
        name
        for name in os.listdir(tmp_path / "ck2")
        if name.startswith("checkpoint") and name[10].isdigit()
    )
    assert numbered == ["checkpoint4.pt"]  # epochs 2 and 4 saved, the older one rotated away
    valid_epochs = [
        json.loads(line)["epoch"]
        for line in result.stdout.splitlines()
        if line.startswith('{"kind": "valid"')
    ]
    assert valid_epochs == [2, 4]  # logged after epochs 2 and 4 ended, naming them


def test_update_checkpoints_are_named_by_the_1_based_epoch(tiny_data, tmp_path):
    result = train(tiny_data, tmp_path / "ck", "--max-update", "4", "--save-interval-updates", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"checkpoint_1_2.pt", "checkpoint_1_4.pt"} <= set(os.listdir(tmp_path / "ck"))
    state = load_checkpoint(str(tmp_path / "ck" / "checkpoint_1_4.pt"))
    assert (
        state["provenance"]["command_line"][-1] == "2" and state["provenance"]["versions"]["torch"]
    )


def test_half_precision_on_a_cpu_warns_once(tiny_data, tmp_path):
    result = train(tiny_data, tmp_path / "ck", "--max-update", "2", "--bf16", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("--bf16 on a CPU") == 1


def test_a_manifest_with_a_missing_entry_is_one_line(tiny_data, tmp_path):
    broken = tmp_path / "data"
    shutil.copytree(tiny_data, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    del manifest["spm"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert_one_line_error(
        train(str(broken), tmp_path / "ck", "--max-update", "1"), "manifest.json", "'spm'"
    )


def test_languages_are_checked_against_the_dataset(tiny_data, tmp_path):
    assert_one_line_error(
        train(tiny_data, tmp_path / "ck", "-s", "en", "-t", "fr"), "--target-lang fr", "en-de"
    )


def test_verify_data_finds_a_corrupt_token_that_stays_in_the_vocabulary(tiny_data, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(tiny_data, copy)
    assert train(str(copy), tmp_path / "ok", "--max-update", "1", "--verify-data").returncode == 0
    path = copy / "train.en.bin"
    data = bytearray(path.read_bytes())
    data[-4] = 5 if data[-4] != 5 else 6  # a token id byte: still a valid id, same size
    path.write_bytes(bytes(data))
    assert (
        train(str(copy), tmp_path / "ck", "--max-update", "1").returncode == 0
    )  # nothing else notices
    assert_one_line_error(
        train(str(copy), tmp_path / "ck2", "--max-update", "1", "--verify-data"),
        "--verify-data",
        str(path),
        "SHA-256",
    )


def test_stop_time_hours_counts_the_time_of_the_runs_it_resumed(tiny_data, tmp_path):
    save_dir = tmp_path / "ck"
    budget = (
        "--max-update",
        "100000",
        "--stop-time-hours",
        "0.0001",
    )  # 0.36 s: reached at the first update
    first = train(tiny_data, save_dir, *budget)
    assert first.returncode == 0, first.stderr[-3000:]
    state = load_checkpoint(str(save_dir / "checkpoint_last.pt"))
    assert state["num_updates"] >= 1 and state["earlier_seconds"] > 0.36

    again = train(tiny_data, save_dir, *budget)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "--stop-time-hours 0.0001 reached by the runs this one resumed" in again.stderr
    assert (
        load_checkpoint(str(save_dir / "checkpoint_last.pt"))["num_updates"] == state["num_updates"]
    )

    longer = train(
        tiny_data,
        save_dir,
        "--max-update",
        "100000",
        "--stop-time-hours",
        str((state["earlier_seconds"] + 1) / 3600),
    )
    assert longer.returncode == 0, longer.stderr[-3000:]
    resumed = load_checkpoint(str(save_dir / "checkpoint_last.pt"))
    assert (
        resumed["num_updates"] > state["num_updates"]
        and resumed["earlier_seconds"] > state["earlier_seconds"] + 1
    )


def test_a_vocabulary_per_language_is_never_shared(tmp_path):
    tiny_corpus(tmp_path, {"train": (300, 5)}, **REVERSAL_PAIRS)
    separate = tiny_dataset(tmp_path, valid=(), separate_vocab=True)
    # Same vocabulary sizes, other pieces: sharing them would pass every size check and train nonsense.
    assert_one_line_error(
        train(separate, tmp_path / "ck", "--max-update", "1"),
        "--share-all-embeddings: needs one joint vocabulary",
        "--separate-vocab",
    )
    small_model = [
        flag
        for flag in train_command(separate, tmp_path / "ck2", "--max-update", "1")
        if flag != "--share-all-embeddings"
    ]
    preset_shares = run_subprocess(
        [separate, *small_model]
    )  # transformer_tiny shares all embeddings when it can
    assert preset_shares.returncode == 0, preset_shares.stderr[-3000:]
    model_config = load_checkpoint(str(tmp_path / "ck2" / "checkpoint_last.pt"))["model_config"]
    assert (
        not model_config["share_all_embeddings"]
        and model_config["share_decoder_input_output_embed"]
    )

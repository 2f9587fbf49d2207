import json
import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from nmt.checkpoint_io import load_checkpoint
from nmt.data.plan import Update, micro_seed

from ..helpers import (
    descendants,
    free_port,
    parse_log,
    process_group,
    run_subprocess,
    train_command,
)


def losses(records):
    return np.array([r["loss"] for r in records])


def test_tiny_model_trains_and_loss_falls(tiny_data, tmp_path):
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--max-update", "40")]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = parse_log(result.stdout)
    assert [r["update"] for r in records] == list(range(1, 41))
    for key in ("update", "epoch", "loss", "lr", "ntokens", "nsentences", "wps"):
        assert key in records[0]
    # A broken update stays near the first losses (6.6 here); 40 updates of a working one reach ~4.9.
    assert losses(records)[-5:].mean() < 0.8 * losses(records)[:5].mean()
    state = load_checkpoint(str(tmp_path / "ck" / "checkpoint_last.pt"))
    assert state["num_updates"] == 40 and state["model_config"]["encoder_embed_dim"] == 32


@pytest.mark.slow
def test_two_ranks_equal_one_rank_with_twice_the_accumulation(tiny_data, tmp_path):
    """2 ranks x update-freq 1 == 1 rank x update-freq 2, with dropout on (seeded per batch), across an
    epoch's end (31 batches: one rank runs a dummy batch in the last update of epoch 1)."""
    common = ["--max-update", "18", "--dropout", "0.1", "--max-tokens", "300"]
    one = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "one", *common, "--update-freq", "2")]
    )
    two = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "two", *common, "--update-freq", "1")],
        torchrun_procs=2,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = parse_log(one.stdout), parse_log(two.stdout)
    assert len(a) == len(b) == 18 and a[-1]["epoch"] == 2
    assert [r["ntokens"] for r in a] == [r["ntokens"] for r in b]
    np.testing.assert_allclose(losses(a), losses(b), rtol=1e-5)


@pytest.mark.slow
def test_kill_9_and_resume_reproduces_the_uninterrupted_losses(tiny_data, tmp_path):
    args = ["--max-update", "30", "--save-interval-updates", "3", "--dropout", "0.1"]
    reference = run_subprocess([tiny_data, *train_command(tiny_data, tmp_path / "ref", *args)])
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = {r["update"]: r["loss"] for r in parse_log(reference.stdout)}

    save_dir = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "nmt_cli.train",
        tiny_data,
        *train_command(tiny_data, save_dir, *args),
    ]
    seen = []
    with process_group(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ) as process:
        for line in process.stdout:
            seen.extend(parse_log(line))
            if seen and seen[-1]["update"] >= 14:
                process.send_signal(signal.SIGKILL)
                break
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    resumed = run_subprocess([tiny_data, *train_command(tiny_data, save_dir, *args)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = parse_log(resumed.stdout)
    assert after[0]["update"] in (13, 14, 15, 16)  # resumes from the last save (every 3 updates)
    assert after[-1]["update"] == 30
    for record in seen + after:
        assert record["loss"] == pytest.approx(expected[record["update"]], rel=1e-6), record[
            "update"
        ]


def test_sigterm_finishes_the_update_saves_and_exits_0(tiny_data, tmp_path):
    command = [
        sys.executable,
        "-m",
        "nmt_cli.train",
        tiny_data,
        *train_command(tiny_data, tmp_path / "ck", "--max-update", "100000"),
    ]
    with process_group(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    ) as process:
        for line in process.stdout:
            if parse_log(line) and parse_log(line)[-1]["update"] >= 3:
                process.send_signal(signal.SIGTERM)
                break
        rest = process.stdout.read()
        assert process.wait(timeout=60) == 0
    last_update = max([r["update"] for r in parse_log(rest)], default=3)
    assert (
        load_checkpoint(str(tmp_path / "ck" / "checkpoint_last.pt"))["num_updates"] == last_update
    )


def make_trainer(tiny_data, save_dir, *extra):
    from nmt.data import load_manifest
    from nmt.train.trainer import Trainer
    from nmt_cli.train import build_parser, make_configs

    manifest = load_manifest(tiny_data)
    train_cfg, model_cfg = make_configs(
        build_parser().parse_args([tiny_data, *train_command(tiny_data, save_dir, *extra)]),
        manifest,
    )
    return Trainer(train_cfg, model_cfg, manifest=manifest)


def update_of(trainer, *batches):
    """One update of these batches (sample indices) of the first epoch, as the data plan makes it."""
    micro = [part for indices in batches for part in trainer.plan.micro_batches(indices)]
    tgt = trainer.plan.current.dataset.tgt_lengths
    return Update(
        micro,
        num_tokens=int(sum(tgt[i].sum() for i in batches)),
        num_sentences=int(sum(len(i) for i in batches)),
        epoch=1,
        ends_epoch=False,
    )


def step_and_read(trainer, update):
    """Run one update and read the device's sums (what a log point does)."""
    trainer.step(update)
    return trainer.step.read()


def test_padded_and_packed_layouts_give_the_same_update(tiny_data, tmp_path):
    """Same samples, both layouts: same loss, same gradients, same parameters after the step."""
    # Dropout off: its masks are drawn over differently shaped tensors in the two layouts.
    trainers = [
        make_trainer(tiny_data, tmp_path / layout, "--layout", layout, "--dropout", "0")
        for layout in ("padded", "packed")
    ]
    stats = [step_and_read(t, update_of(t, np.arange(0, 9), np.arange(20, 31))) for t in trainers]
    assert stats[0].loss == pytest.approx(stats[1].loss, rel=1e-5)
    assert stats[0].grad_norm == pytest.approx(stats[1].grad_norm, rel=1e-4)
    for (name, a), (_, b) in zip(
        trainers[0].model.named_parameters(), trainers[1].model.named_parameters()
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=name)


def test_max_tokens_per_microbatch_splits_without_changing_the_update(tiny_data, tmp_path):
    whole = make_trainer(tiny_data, tmp_path / "whole", "--dropout", "0")
    split = make_trainer(
        tiny_data, tmp_path / "split", "--dropout", "0", "--max-tokens-per-microbatch", "40"
    )
    indices = np.arange(0, 12)
    assert len(split.plan.micro_batches(indices)) > 1
    a = step_and_read(whole, update_of(whole, indices))
    b = step_and_read(split, update_of(split, indices))
    assert a.loss == pytest.approx(b.loss, rel=1e-5) and a.grad_norm == pytest.approx(
        b.grad_norm, rel=1e-4
    )


def test_checkpoint_loads_with_weights_only_and_rejects_pickled_code(tiny_data, tmp_path):
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--max-update", "2")]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    path = tmp_path / "ck" / "checkpoint_last.pt"
    state = torch.load(path, weights_only=True)  # no code runs from the file
    assert {
        "model",
        "optimizer",
        "lr_scheduler",
        "data_plan",
        "rng",
        "train_config",
        "model_config",
        "vocab",
    } <= set(state)

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as handle:
        pickle.dump({"format": "nmt-checkpoint", "x": Payload()}, handle, protocol=2)
    with pytest.raises(ValueError, match="not an nmt checkpoint"):
        load_checkpoint(str(evil))


def test_bad_options_give_one_line_errors(tiny_data, tmp_path):
    result = run_subprocess(
        [
            tiny_data,
            *train_command(tiny_data, tmp_path / "ck", "--max-update", "2", "--update-freq", "0"),
        ]
    )
    assert result.returncode == 1 and "--update-freq" in result.stderr
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--encoder-embed-dim", "30")]
    )
    assert result.returncode == 1 and "--encoder-embed-dim" in result.stderr


def test_dropout_seed_depends_on_position_only():
    assert micro_seed(1, 0, 5, 0) == micro_seed(1, 0, 5, 0)
    assert (
        len(
            {micro_seed(1, 0, g, 0) for g in range(100)}
            | {micro_seed(1, 1, 0, 0), micro_seed(2, 0, 0, 0)}
        )
        == 102
    )


def test_eval_bleu_validation_picks_the_best_checkpoint_by_bleu(tiny_data, tmp_path):
    result = run_subprocess(
        [
            tiny_data,
            *train_command(
                tiny_data,
                tmp_path / "ck",
                "--max-update",
                "4",
                "--validate-interval-updates",
                "2",
                "--eval-bleu",
                "--eval-bleu-beam",
                "2",
                "--best-checkpoint-metric",
                "bleu",
            ),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]

    valid = [
        json.loads(line)
        for line in result.stdout.splitlines()
        if line.startswith('{"kind": "valid"')
    ]
    assert [r["update"] for r in valid][:1] == [2] and all(
        0.0 <= r["valid_bleu"] <= 100.0 for r in valid
    )
    best = load_checkpoint(str(tmp_path / "ck" / "checkpoint_best.pt"))
    assert best["best"] == max(r["valid_bleu"] for r in valid)


def test_num_workers_prefetch_gives_the_same_losses(tiny_data, tmp_path):
    args = ["--max-update", "8", "--dropout", "0.1"]
    inline = run_subprocess([tiny_data, *train_command(tiny_data, tmp_path / "a", *args)])
    workers = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "b", *args, "--num-workers", "2")]
    )
    assert inline.returncode == 0 and workers.returncode == 0, (
        inline.stderr[-2000:] + workers.stderr[-2000:]
    )
    assert losses(parse_log(inline.stdout)).tolist() == losses(parse_log(workers.stdout)).tolist()
    assert all(0.0 <= r["padding_ratio"] < 0.5 for r in parse_log(inline.stdout))


def _worker_pids(launcher_pid, rank):
    """The nmt-train worker of ``rank`` that torchrun (``launcher_pid``) runs now."""
    found = []
    for pid in descendants(launcher_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = dict(
                    item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item
                )
        except OSError:
            continue
        if environ.get(b"RANK") == str(rank).encode() and b"TORCHELASTIC_RUN_ID" in environ:
            found.append(pid)
    return found


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_after_a_rank_dies(tiny_data, tmp_path):
    args = ["--max-update", "24", "--save-interval-updates", "3", "--dropout", "0.1"]
    reference = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ref", *args)], torchrun_procs=2
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = {r["update"]: r["loss"] for r in parse_log(reference.stdout)}

    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "-m",
        "nmt_cli.train",
        tiny_data,
        *train_command(tiny_data, tmp_path / "crash", *args),
    ]
    seen, killed = [], []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "torchrun.err", "w")
    with process_group(
        command, timeout=240, stdout=subprocess.PIPE, stderr=log, env=env
    ) as process:
        for line in process.stdout:
            seen.extend(parse_log(line))
            if not killed and seen and seen[-1]["update"] >= 10:
                killed = _worker_pids(process.pid, rank=1)
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
        process.wait(timeout=120)
    log.close()
    assert killed and process.returncode == 0, (tmp_path / "torchrun.err").read_text()[-3000:]
    updates = [r["update"] for r in seen]
    assert updates[-1] == 24  # the restarted job ran to the end
    (restart,) = [i for i in range(1, len(updates)) if updates[i] <= updates[i - 1]]
    assert updates[restart] in range(8, 14)  # resumed from the last save (every 3 updates)
    for record in seen:
        assert record["loss"] == pytest.approx(expected[record["update"]], rel=1e-6), record[
            "update"
        ]


def test_a_run_shorter_than_an_epoch_validates_its_last_update(tiny_data, tmp_path):
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "short", "--max-update", "3")]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert parse_log(result.stdout)[-1]["epoch"] == 1  # stopped inside the first epoch
    valid = [
        json.loads(line)
        for line in result.stdout.splitlines()
        if line.startswith('{"kind": "valid"')
    ]
    assert [r["update"] for r in valid] == [3]
    assert (tmp_path / "short" / "checkpoint_best.pt").exists()

"""Trainer options beyond the core loop: precision, non-finite updates, TensorBoard, curriculum."""

import glob
import math

import numpy as np
import pytest
import torch

from ..helpers import parse_log, run_subprocess, train_command
from .test_trainer import make_trainer, update_of


@pytest.mark.parametrize("flag", ["--bf16", "--fp16"])
def test_mixed_precision_trains_on_cpu(tiny_data, tmp_path, flag):
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--max-update", "6", flag)]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = parse_log(result.stdout)
    assert len(records) == 6 and all(math.isfinite(r["loss"]) for r in records)
    if flag == "--fp16":
        assert records[-1]["loss_scale"] > 1  # the scaler is live


def test_non_finite_updates_are_skipped_counted_then_stop_training(tiny_data, tmp_path):
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--max-consecutive-nonfinite", "2")
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with torch.no_grad():
        trainer.model.encoder.layers[0].ffn.fc1.weight[0, 0] = float("inf")
    update = update_of(trainer, np.arange(0, 8))
    trainer.step(update)
    reading = trainer.step.read()
    assert reading.skipped_updates == 1 and not math.isfinite(reading.grad_norm)
    for name, p in trainer.model.named_parameters():  # no optimizer step happened
        if name != "encoder.layers.0.ffn.fc1.weight":
            assert torch.equal(p, before[name]), name
    assert all(int(s["step"]) == 0 for s in trainer.step.optimizer.state.values())
    trainer.step(update)
    with pytest.raises(RuntimeError, match="2 consecutive updates with a non-finite"):
        trainer.step.read()


def test_a_good_update_ends_a_run_of_non_finite_ones(tiny_data, tmp_path):
    """The limit counts updates in a row: one good update in between starts the count again, even
    when no read happened in between (the count is kept on the device)."""
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--max-consecutive-nonfinite", "2")
    weight = trainer.model.encoder.layers[0].ffn.fc1.weight
    good = weight.detach()[0, 0].clone()
    update = update_of(trainer, np.arange(0, 8))
    for value in (float("nan"), good, float("nan"), good):
        with torch.no_grad():
            weight[0, 0] = value
        trainer.step(update)
    reading = trainer.step.read()
    assert reading.skipped_updates == 2 and reading.longest_nonfinite_run == 1


def test_tensorboard_scalars_are_written(tiny_data, tmp_path):
    logdir = tmp_path / "tb"
    result = run_subprocess(
        [
            tiny_data,
            *train_command(
                tiny_data, tmp_path / "ck", "--max-update", "3", "--tensorboard-logdir", str(logdir)
            ),
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (event_file,) = glob.glob(str(logdir / "events.out.tfevents.*"))
    accumulator = EventAccumulator(event_file)
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/wps", "train/gnorm", "train/padding_ratio"} <= tags
    assert [event.step for event in accumulator.Scalars("train/loss")] == [1, 2, 3]


def test_length_curriculum_runs_easy_batches_first(tiny_data, tmp_path):
    trainer = make_trainer(
        tiny_data, tmp_path / "ck", "--curriculum", "length", "--curriculum-epochs", "1"
    )
    epoch = trainer.plan.current  # one rank: its batches are the global sequence
    batches = epoch.rank_batches
    hardest = [
        int(np.maximum(epoch.dataset.src_lengths[b], epoch.dataset.tgt_lengths[b]).max())
        for b in batches.to_list()
    ]
    assert hardest == sorted(hardest) and hardest[0] < hardest[-1]


def test_curriculum_file_is_checked_against_the_corpus(tiny_data, tmp_path):
    scores = tmp_path / "scores.txt"
    scores.write_text("0.5\n1.5\n")
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--curriculum", f"file:{scores}")]
    )
    assert (
        result.returncode == 1
        and "scores.txt: 2 scores, expected one per training line (600)" in result.stderr
    )
    scores.write_text("".join(f"{i % 7}\n" for i in range(599)) + "oops\n")
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--curriculum", f"file:{scores}")]
    )
    assert result.returncode == 1 and "scores.txt:600: not a number" in result.stderr


def test_fp16_overflow_skips_are_counted_but_are_no_divergence(tiny_data, tmp_path):
    """An fp16 loss-scale overflow skips the step (GradScaler's found_inf, read by the fused
    optimizer on the device) and counts in skipped_updates, not in the run of non-finite updates
    that --max-consecutive-nonfinite stops on (the scale adapts instead)."""
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--fp16", "--max-consecutive-nonfinite", "1")
    trainer.step.scaler._init_scale = 3e38  # the first scaled loss overflows
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.step(update_of(trainer, np.arange(0, 8)))
    reading = trainer.step.read()
    assert reading.skipped_updates == 1 and reading.longest_nonfinite_run == 0
    assert reading.loss_scale < 3e38  # lowered for the next update
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_distributed_backend_choices():
    """NCCL for GPU tensors unless --distributed-backend gloo (ranks sharing one GPU, which NCCL
    refuses); NCCL asked for on the CPU is the option's error, not a hang at the first collective."""
    from nmt import dist

    assert dist.backend_for("cuda") == dist.backend_for("cuda", "nccl") == "cpu:gloo,cuda:nccl"
    assert dist.backend_for("cuda", "gloo") == "gloo"
    assert dist.backend_for("cpu") == dist.backend_for("cpu", "gloo") == "gloo"
    with pytest.raises(ValueError, match="--distributed-backend nccl: needs CUDA"):
        dist.backend_for("cpu", "nccl")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "cuda:x"], "--device: must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
        (["--device", "gpu"], "--device: must be auto, cpu, cuda or cuda:N, got 'gpu'"),
        (
            ["--cpu", "--distributed-backend", "nccl"],
            "--distributed-backend: nccl needs CUDA devices, but --device is cpu",
        ),
    ],
)
def test_device_options_are_checked_in_one_line(tiny_data, tmp_path, args, message):
    result = run_subprocess(
        [tiny_data, *train_command(tiny_data, tmp_path / "ck", "--max-update", "1", *args)]
    )
    assert result.returncode != 0
    assert message in result.stderr.strip().splitlines()[-1]


def test_cosine_over_the_time_budget_reaches_its_floor_when_the_time_is_up(tiny_data, tmp_path):
    budget = ("--lr-scheduler", "cosine", "--stop-time-hours", "0.002", "--max-update", "100000")
    result = run_subprocess([tiny_data, *train_command(tiny_data, tmp_path / "ck", *budget)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--stop-time-hours 0.002 reached" in result.stderr
    lrs = [r["lr"] for r in parse_log(result.stdout) if r["update"] > 10]  # after the warm-up
    assert len(lrs) > 20
    assert all(later <= earlier for earlier, later in zip(lrs, lrs[1:]))
    assert lrs[-1] < 0.1 * 0.003 < lrs[0]  # peak --lr 0.003, floor --min-lr 0


def test_a_reset_cosine_resumes_where_the_time_budget_stands(tiny_data, tmp_path):
    cosine = ("--lr-scheduler", "cosine", "--max-update", "100000")
    first = run_subprocess(
        [
            tiny_data,
            *train_command(tiny_data, tmp_path / "ck", *cosine, "--stop-time-hours", "0.002"),
        ]
    )
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_subprocess(
        [
            tiny_data,
            *train_command(tiny_data, tmp_path / "ck", *cosine, "--stop-time-hours", "0.003"),
            "--reset-lr-scheduler",
        ]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first_update = parse_log(first.stdout)[-1]["update"] + 1
    first_lr = next(r["lr"] for r in parse_log(resumed.stdout) if r["update"] == first_update)
    # Two thirds of the budget (or more) were spent: the cosine has taken the peak (0.003) to a
    # quarter; a fresh schedule would start at the peak.
    assert first_lr <= 0.25 * 0.003


def test_cosine_without_a_limit_to_decay_over_is_refused(tiny_data, tmp_path):
    flags = ("--lr-scheduler", "cosine", "--max-epoch", "1")
    result = run_subprocess([tiny_data, *train_command(tiny_data, tmp_path / "ck", *flags)])
    assert result.returncode != 0
    assert (
        "--lr-scheduler: cosine needs --max-update or --stop-time-hours"
        in result.stderr.strip().splitlines()[-1]
    )

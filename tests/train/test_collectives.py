"""The training step on the GPU it was written for, proven without one: every collective on a
device its process group serves, and no host read of the device inside an update."""

import os
from collections import Counter

import numpy as np
import pytest
import torch

from nmt.train.step import UpdateStep

from ..helpers import parse_log, run_torchrun, train_command
from .test_trainer import make_trainer

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_every_collective_of_a_two_rank_run_is_served_by_the_cuda_process_group(
    tiny_data, tmp_path
):
    """2 gloo ranks on the CPU, each collective checked against the backend nmt would start on CUDA
    (a pure NCCL group refused every CPU tensor: the first update of any multi-GPU run crashed)."""
    args = train_command(
        tiny_data,
        tmp_path / "ck",
        "--max-update",
        "6",
        "--log-interval",
        "2",
        "--validate-interval-updates",
        "3",
        "--max-tokens-per-microbatch",
        "100",
    )
    result = run_torchrun(os.path.join(HERE, "_collective_check.py"), tiny_data, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["update"] for r in parse_log(result.stdout)] == [2, 4, 6]
    assert result.stderr.count("collectives checked:") == 2  # both ranks ran to the end
    assert "(all_reduce" in result.stderr  # the hot loop's, at least


HOST_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


def test_an_update_never_reads_the_device(tiny_data, tmp_path, monkeypatch):
    """Every way a tensor's value reaches the host (each one a wait for the device on a GPU) is
    counted: none inside an update, none between updates but at log points (every 4th update here)
    and at the run's end (save and validation). ``.numpy()`` is not counted: it fails on a device
    tensor, so it only ever reads host data."""
    trainer = make_trainer(
        tiny_data,
        tmp_path / "ck",
        "--max-update",
        "10",
        "--log-interval",
        "4",
        "--layout",
        "packed",
    )
    reads: Counter = Counter()
    where = {"phase": "set-up"}

    def counting(name):
        method = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            reads[(where["phase"], trainer.num_updates)] += 1
            return method(self, *args, **kwargs)

        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    step_call = UpdateStep.__call__

    def step(self, update):
        where["phase"] = "update"
        try:
            return step_call(self, update)
        finally:
            where["phase"] = "between updates"

    monkeypatch.setattr(UpdateStep, "__call__", step)
    assert trainer.train() == 10
    inside = {key: n for key, n in reads.items() if key[0] == "update"}
    assert inside == {}, f"host reads inside updates (phase, updates done before): {inside}"
    between = {update for phase, update in reads if phase == "between updates"}
    assert between <= {4, 8, 10}, sorted(between)
    assert {4, 8} <= between  # the log points do read, once each


def test_non_finite_skips_are_decided_on_the_device(tiny_data, tmp_path):
    """A non-finite gradient skips the optimizer step without the host looking: the parameters
    and the optimizer's step count stay, the skip is counted when the sums are read."""
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--max-consecutive-nonfinite", "3")
    with torch.no_grad():
        trainer.model.decoder.layers[0].ffn.fc2.weight[0, 0] = float("nan")
    from .test_trainer import update_of

    trainer.step(update_of(trainer, np.arange(0, 8)))
    assert all(int(s["step"]) == 0 for s in trainer.step.optimizer.state.values())
    assert trainer.step.read().skipped_updates == 1

"""The host off an update's critical path (issue 47): the operations an update dispatches, counted
(deterministic, machine-independent), and batches collated ahead by a thread, exactly as in line."""

import threading
import time

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.data.plan import made_ahead

from .test_trainer import make_trainer

# Aten operations of one update of the tests' tiny model (1+1 layers, dropout 0.1, --clip-norm 1)
# on the CPU: 458 packed and 444 padded when set (509 and 476 before issue 47: collation on the
# update's thread, torch index building, per-chunk loss sums), plus 4. Collation back on the
# update's thread alone adds 6 to 10: a change that adds operations to every update says so here.
# benchmarks/host_overhead.py counts the same way, by phase.
OPERATION_BUDGET = {"packed": 462, "padded": 448}


class OperationCounter(TorchDispatchMode):
    """Every aten operation dispatched by this thread below autograd (the forward's, the
    backward's, the optimizer's): what the host pays for one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def update_operations(trainer):
    """Operations of the second update of a run (the first makes the optimizer's state), the
    data plan's next update included."""
    trainer.plan.begin_epoch()
    updates = trainer.plan.updates()
    trainer.step(next(updates))
    with OperationCounter() as counter:
        trainer.step(next(updates))
    return counter.count


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_an_update_dispatches_no_more_operations_than_measured(tiny_data, tmp_path, layout):
    trainer = make_trainer(
        tiny_data, tmp_path / "ck", "--layout", layout, "--clip-norm", "1.0", "--device", "cpu"
    )
    try:
        count = update_operations(trainer)
    finally:
        trainer.close()
    assert count <= OPERATION_BUDGET[layout], (
        f"one {layout} update dispatches {count} operations, over its budget of "
        f"{OPERATION_BUDGET[layout]}: benchmarks/host_overhead.py shows which phase grew"
    )


def plan_batches(trainer, *, start=0):
    """Every micro-batch of the first epoch from update ``start`` on: (indices, tensors)."""
    trainer.plan.load_state_dict({"epoch": 0, "epoch_start_update": 0, "updates_done": start})
    trainer.plan.begin_epoch()
    return [
        (micro.indices, micro.batch) for u in trainer.plan.updates() for micro in u.micro_batches
    ]


def assert_same_batches(made, expected):
    assert len(made) == len(expected)
    for (indices, batch), (want_indices, want) in zip(made, expected):
        np.testing.assert_array_equal(indices, want_indices)
        assert batch.keys() == want.keys()
        for key in want:
            assert torch.equal(batch[key], want[key]), key


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_batches_made_ahead_are_those_made_in_line_in_order_resume_included(
    tiny_data, tmp_path, layout
):
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--layout", layout, "--update-freq", "2")
    try:
        ahead = plan_batches(trainer)
        assert len(ahead) > 10
        # In line: each update's batches collated here, from its indices.
        in_line = [(indices, trainer.plan.micro_batches(indices)[0].batch) for indices, _ in ahead]
        assert_same_batches(ahead, in_line)
        # A resume at update 3 (6 batches in, update-freq 2) makes the rest of the same sequence.
        assert_same_batches(plan_batches(trainer, start=3), in_line[6:])
    finally:
        trainer.close()


def test_made_ahead_works_ahead_in_a_thread_and_stops_when_the_caller_does():
    made, threads = [], set()

    def make(batch):
        made.append(int(batch[0]))
        threads.add(threading.current_thread().name)
        return {"x": torch.from_numpy(batch)}

    batches = [np.array([i]) for i in range(100)]
    iterator = made_ahead(make, batches, ahead=4)
    assert int(next(iterator)["x"][0]) == 0
    deadline = time.monotonic() + 10
    while len(made) < 5 and time.monotonic() < deadline:  # the next ones, before being asked
        time.sleep(0.01)
    assert made[:5] == [0, 1, 2, 3, 4]
    assert threads and threading.current_thread().name not in threads
    assert [int(next(iterator)["x"][0]) for _ in range(3)] == [1, 2, 3]
    iterator.close()  # the caller stops: nothing more is made
    time.sleep(0.1)
    assert len(made) <= 9 and made == sorted(made)
    assert [int(b["x"][0]) for b in made_ahead(make, batches[:7], ahead=2)] == list(range(7))

"""nmt.dist.session, the one process session of every command: two gloo ranks join, see each other,
and leave the group whether the block ends normally or raises."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from nmt import dist


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank(rank: int, port: int, results: dict) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    with dist.session("cpu", timeout_minutes=1) as this_process:
        total = dist.all_reduce_sum(torch.tensor([rank + 1]))
    results[rank] = (this_process, int(total.item()), dist.is_initialized())
    try:  # a second session after the first: the group was left, so it can be joined again
        with dist.session("cpu", timeout_minutes=1):
            dist.barrier()
            raise ValueError(f"rank {rank} failed")
    except ValueError as error:
        results[rank] += (str(error), dist.is_initialized())


@pytest.mark.slow  # two spawned ranks import torch each: ~20-50 s on 2 busy CPUs
def test_two_ranks_join_and_leave_the_group_whatever_happens():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(_free_port(), results), nprocs=2)
        results = dict(results)
    assert results == {
        rank: (
            dist.Session(rank, 2, torch.device("cpu")),
            3,  # 1 + 2: the ranks reduced together
            False,
            f"rank {rank} failed",
            False,
        )
        for rank in (0, 1)
    }


def test_one_process_has_no_group():
    with dist.session("cpu") as this_process:
        assert this_process == dist.Session(0, 1, torch.device("cpu")) and this_process.is_main
        assert not dist.is_initialized()

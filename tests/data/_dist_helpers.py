"""A pool of real gloo processes for distributed tests: start once, run many tasks.

Spawning and joining a process group costs seconds, so a module-scoped pool runs every example of
a property-based test in the same W processes. Tasks are module-level functions (picklable).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, inbox: Any, outbox: Any) -> None:
    import datetime

    import torch.distributed as torch_dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size)
    )
    torch_dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60)
    )
    while (task := inbox.get()) is not None:
        fn, args = task
        try:
            outbox.put(("ok", fn(*args)))
        except Exception:  # report to the test process instead of hanging it
            outbox.put(("error", traceback.format_exc()))


class GlooPool:
    def __init__(self, world_size: int) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        self.world_size = world_size
        self.inboxes = [ctx.Queue() for _ in range(world_size)]
        self.outboxes = [ctx.Queue() for _ in range(world_size)]
        self.processes = [
            ctx.Process(
                target=_worker,
                args=(r, world_size, port, self.inboxes[r], self.outboxes[r]),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for process in self.processes:
            process.start()

    def run(self, fn: Callable[..., Any], per_rank_args: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``fn(*per_rank_args[r])`` on every rank r; return the results in rank order."""
        for inbox, args in zip(self.inboxes, per_rank_args):
            inbox.put((fn, args))
        results = [outbox.get(timeout=120) for outbox in self.outboxes]
        errors = [payload for status, payload in results if status == "error"]
        if errors:
            raise AssertionError("worker failed:\n" + "\n".join(errors))
        return [payload for _, payload in results]

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def sample_sort_task(shard: Any, samples_per_rank: int) -> Any:
    from nmt.data.sample_sort import distributed_sample_sort

    return distributed_sample_sort(shard, samples_per_rank=samples_per_rank)


def partition_task(lengths: Any, max_tokens: int) -> Any:
    from nmt.data.packing import partition_microbatches

    return partition_microbatches(lengths, max_tokens)

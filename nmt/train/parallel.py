"""The distributed set-up and tear-down of a run, and the only place that wraps a model for data
parallelism (DDP over torchrun's process group)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

from nmt import dist
from nmt.device import resolve_device


@dataclass(frozen=True)
class Session:
    """Where this process runs: its rank among ``world_size`` and its device."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@contextlib.contextmanager
def session(device: str, backend_choice: str = "auto") -> Iterator[Session]:
    """Pick this rank's device, join torchrun's process group (``dist.backend_for`` that device and
    ``--distributed-backend``; nothing for one process), and leave the group at the end whatever
    happens."""
    env = dist.env_from_environ()
    resolved = resolve_device(
        device, local_rank=env.local_rank
    )  # before the group: NCCL binds to it
    dist.init_distributed(resolved.type, backend_choice=backend_choice)
    try:
        yield Session(env.rank, env.world_size, resolved)
    finally:
        dist.destroy()


def wrap_data_parallel(model: torch.nn.Module, *, device: torch.device) -> torch.nn.Module:
    """DDP when there are several ranks, the module itself otherwise.

    Buckets stay at DDP's default 25 MiB (>= 1 MiB keeps DDPOptimizer's graph splitting under
    torch.compile working).
    """
    if dist.get_world_size() == 1:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


@contextlib.contextmanager
def maybe_no_sync(model: torch.nn.Module, *, sync: bool) -> Iterator[None]:
    """Skip DDP's gradient all-reduce on all but the last micro-batch of an update (``model``: DDP,
    or DDP compiled)."""
    model = getattr(model, "_orig_mod", model)
    if sync or not isinstance(model, DistributedDataParallel):
        yield
    else:
        with model.no_sync():
            yield

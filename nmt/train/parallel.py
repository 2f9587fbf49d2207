"""The only place that wraps a model for data parallelism (DDP over the process group that
``nmt.dist.session`` joined)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.parallel import DistributedDataParallel

from nmt import dist


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

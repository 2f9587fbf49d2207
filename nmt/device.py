"""Devices: which one ``--device`` means, and host-to-device copies that do not stall the host."""

from __future__ import annotations

from typing import Any

import torch


def resolve_device(name: str, *, local_rank: int | None = None) -> torch.device:
    """``--device``: auto (CUDA when available, else the CPU), cpu, cuda, cuda:N.

    Under torchrun (``local_rank`` given) ``cuda`` means this rank's GPU, ``cuda:LOCAL_RANK``;
    otherwise the current one (``cuda:0`` unless CUDA_VISIBLE_DEVICES or the caller chose). A
    CUDA device is made the current one: NCCL communicators bind to the current device, so it must
    be set before the process group starts.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available (use --device auto or cpu)")
    if device.index is None:  # set_device wants an index ("Expected a torch.device with ...")
        index = torch.cuda.current_device() if local_rank is None else local_rank
        device = torch.device("cuda", index)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    torch.cuda.set_device(device)
    return device


def move(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``. A host tensor goes to CUDA through pinned memory, so the copy is
    asynchronous (a non_blocking copy from pageable memory is staged synchronously)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def move_batch(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor of ``batch`` ``move``d to ``device``; other values as they are."""
    return {k: move(v, device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

"""Rank and world size from torchrun's environment, the one process session every command runs in
(``session``), and collectives that are no-ops on one rank.

This is the only module (with ``nmt.train.parallel``) that calls ``torch.distributed`` directly,
so the rest of the library can be run and tested in one process without a process group.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist

from nmt.device import resolve_device

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_from_environ(environ: dict[str, str] | None = None) -> DistEnv:
    """Read RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them; a plain run is rank 0 of 1."""
    environ = os.environ if environ is None else environ
    try:
        rank = int(environ.get("RANK", "0"))
        world_size = int(environ.get("WORLD_SIZE", "1"))
        local_rank = int(environ.get("LOCAL_RANK", str(rank)))
    except ValueError as error:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers: {error}") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"invalid torchrun environment: RANK={rank} WORLD_SIZE={world_size}")
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank)


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
def session(
    device: str = "cpu", *, backend_choice: str = "auto", timeout_minutes: float = 30.0
) -> Iterator[Session]:
    """This process's place in the run, for every command (train, eval, filter, generation, sharded
    preprocessing): its device (``--device``; under torchrun ``cuda`` is this rank's GPU), then
    torchrun's process group joined (``init_distributed``; nothing for one process), left at the
    end whatever happens."""
    env = env_from_environ()
    # Before the group: NCCL binds to the current device.
    resolved = resolve_device(device, local_rank=env.local_rank if env.world_size > 1 else None)
    init_distributed(resolved.type, backend_choice=backend_choice, timeout_minutes=timeout_minutes)
    try:
        yield Session(env.rank, env.world_size, resolved)
    finally:
        destroy()


def is_initialized() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank() -> int:
    return torch_dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return torch_dist.get_world_size() if is_initialized() else 1


def backend_for(device_type: str, choice: str = "auto") -> str:
    """The process group's backends for a session on ``device_type`` (``choice``:
    ``--distributed-backend``).

    On CUDA one group holds two backends: NCCL for tensors on the GPU (gradients, the hot loop's
    running sums) and gloo for tensors in host memory (the set-up collectives over numpy data:
    the sample sort, blend parts, object broadcasts). Every collective then finds a backend for the
    device its tensor is on, which a pure NCCL group does not ("No backend type associated with
    device type cpu"); and host data is never copied to the GPU only to be reduced there. Object
    collectives on such a group run on the CPU (torch picks cpu when a group has it).

    ``gloo`` reduces GPU tensors with gloo too: slower, but it runs where NCCL refuses, e.g. ranks
    that share one GPU ("Duplicate GPU detected").
    """
    if choice == "nccl" and device_type != "cuda":
        raise ValueError(
            f"--distributed-backend nccl: needs CUDA devices, but this run is on {device_type}"
        )
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" and choice != "gloo" else "gloo"


def init_distributed(
    device_type: str, *, backend_choice: str = "auto", timeout_minutes: float = 30.0
) -> DistEnv:
    """Join the process group torchrun describes (``backend_for(device_type, backend_choice)``);
    no-op for one rank. On CUDA, call after ``resolve_device`` (which sets the current device)."""
    env = env_from_environ()
    if env.world_size > 1 and not is_initialized():
        backend = backend_for(device_type, backend_choice)
        timeout = datetime.timedelta(minutes=timeout_minutes)
        torch_dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            store=_attempt_store(env, timeout),
        )
        logger.info("joined process group: rank %d of %d (%s)", env.rank, env.world_size, backend)
    return env


def _attempt_store(env: DistEnv, timeout: datetime.timedelta) -> torch_dist.Store | None:
    """After a ``torchrun --max-restarts`` restart, a store whose keys are this attempt's only.

    torchrun's c10d rendezvous keeps one store across restarts, and the process group's keys (each
    rank's address) are the same every attempt: a restarted rank could read a dead peer's address
    from the previous attempt and fail with "connection refused" (or hang). Prefixing the keys with
    the restart count makes every attempt start clean. None (the env:// default) otherwise."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        return None
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = torch_dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        env.world_size,
        is_master=env.rank == 0 and not agent_hosts_store,
        timeout=timeout,
    )
    return torch_dist.PrefixStore(f"nmt/attempt_{restart}/", store)


def destroy() -> None:
    if is_initialized():
        torch_dist.destroy_process_group()


def barrier() -> None:
    if get_world_size() > 1:
        torch_dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks; returns the tensor for chaining."""
    if get_world_size() > 1:
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """In-place max over ranks; returns the tensor for chaining."""
    if get_world_size() > 1:
        torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
    return tensor


def all_reduce_max_int(value: int) -> int:
    return int(all_reduce_max(torch.tensor([value], dtype=torch.int64)).item())


def broadcast_object(obj: object, *, src: int = 0) -> object:
    if get_world_size() == 1:
        return obj
    holder = [obj]
    torch_dist.broadcast_object_list(holder, src=src)
    return holder[0]


def all_gather_variable(tensor: torch.Tensor) -> list[torch.Tensor]:
    """All-gather 1-D (or leading-dim) tensors whose first dimension differs between ranks."""
    world_size = get_world_size()
    if world_size == 1:
        return [tensor]
    size = torch.tensor([tensor.shape[0]], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(world_size)]
    torch_dist.all_gather(sizes, size)
    max_size = int(max(s.item() for s in sizes))
    padded = torch.zeros((max_size, *tensor.shape[1:]), dtype=tensor.dtype)
    padded[: tensor.shape[0]] = tensor
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    torch_dist.all_gather(gathered, padded)
    return [g[: int(s.item())] for g, s in zip(gathered, sizes)]


def world_size_in(group: object = None) -> int:
    """Size of ``group`` (None: the default group); 1 without a process group."""
    return torch_dist.get_world_size(group) if is_initialized() else 1


def all_gather_equal(tensor: torch.Tensor, *, group: object = None) -> list[torch.Tensor]:
    """All-gather a tensor of the same shape on every rank of ``group``; [tensor] on one rank."""
    if world_size_in(group) == 1:
        return [tensor]
    gathered = [torch.empty_like(tensor) for _ in range(world_size_in(group))]
    torch_dist.all_gather(gathered, tensor.contiguous(), group=group)
    return gathered


def all_to_all_v(
    send: torch.Tensor, send_counts: list[int], *, group: object = None
) -> torch.Tensor:
    """Send rows ``send[sum(send_counts[:r]) : ...]`` to rank r of ``group``; return the rows received.

    A true all-to-all-v (uneven split sizes, no padding to the widest chunk): the counts are
    exchanged first so each rank can size its receive buffer. Received rows are in rank order.
    """
    world_size = world_size_in(group)
    if len(send_counts) != world_size:
        raise ValueError(f"need one send count per rank ({world_size}), got {len(send_counts)}")
    if world_size == 1:
        return send
    counts = torch.tensor(send_counts, dtype=torch.int64)
    recv_counts = torch.empty_like(counts)
    torch_dist.all_to_all_single(recv_counts, counts, group=group)
    recv = torch.empty((int(recv_counts.sum()), *send.shape[1:]), dtype=send.dtype)
    torch_dist.all_to_all_single(
        recv,
        send.contiguous(),
        output_split_sizes=recv_counts.tolist(),
        input_split_sizes=send_counts,
        group=group,
    )
    return recv

"""nmt-train under torchrun (gloo, on the CPU) with every collective checked against the process
group nmt starts for a CUDA session: a tensor on a device type that group has no backend for is
refused, as NCCL refuses a CPU tensor ("No backend type associated with device type cpu").

    python -m torch.distributed.run --nproc_per_node 2 _collective_check.py NMT_TRAIN_ARGS...
"""

import sys

import torch
import torch.distributed as torch_dist

from nmt import dist

# The device types a process group's backend string reduces tensors of (torch's rules).
SERVED = {"nccl": {"cuda"}, "gloo": {"cpu", "cuda"}, "mpi": {"cpu", "cuda"}}


def served(backend: str) -> set[str]:
    if ":" in backend:
        return {pair.split(":", 1)[0] for pair in backend.split(",")}
    return SERVED[backend]


cuda_backend: list[str] = []
checked: list[str] = []
real_init = torch_dist.init_process_group


def init_recording_the_backend(*args, backend=None, **kwargs):
    cuda_backend.append(backend)
    return real_init(*args, **{**kwargs, "backend": "gloo"})


def checking(name, collective):
    def call(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        tensors += [
            t for a in args if isinstance(a, list) for t in a if isinstance(t, torch.Tensor)
        ]
        for tensor in tensors:
            if tensor.device.type not in served(cuda_backend[0]):
                raise RuntimeError(
                    f"{name} on a {tensor.device.type} tensor: the process group nmt starts on CUDA "
                    f"({cuda_backend[0]!r}) has no backend for device type {tensor.device.type}"
                )
        checked.append(name)
        return collective(*args, **kwargs)

    return call


torch_dist.init_process_group = init_recording_the_backend
for name in ("all_reduce", "all_gather", "broadcast", "all_to_all_single", "reduce_scatter_tensor"):
    setattr(torch_dist, name, checking(name, getattr(torch_dist, name)))

# The group a CUDA session starts; training then runs on the CPU inside it.
dist.init_distributed("cuda")
from nmt_cli.train import main  # noqa: E402

code = main(sys.argv[1:])
print(f"collectives checked: {len(checked)} ({', '.join(sorted(set(checked)))})", file=sys.stderr)
sys.exit(code)

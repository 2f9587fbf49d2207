"""``--device`` on CUDA, proven without a GPU: torch's CUDA calls replaced by ones that check their
arguments as torch does."""

import pytest
import torch
from torch.cuda._utils import _get_device_index

from nmt.device import resolve_device


@pytest.fixture
def two_fake_gpus(monkeypatch):
    current = {"index": 0}

    def set_device(device):
        current["index"] = _get_device_index(device)  # torch's own check: an index is required

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["index"])
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return current


def test_plain_cuda_is_the_current_gpu(two_fake_gpus):
    """nmt-eval --device cuda (no torchrun) crashed on the first GPU it met: set_device(cuda)."""
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("auto") == torch.device("cuda", 0)
    two_fake_gpus["index"] = 1
    assert resolve_device("cuda") == torch.device("cuda", 1)


def test_under_torchrun_cuda_is_the_local_ranks_gpu(two_fake_gpus):
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert two_fake_gpus["index"] == 1
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)


def test_a_gpu_that_is_not_there_is_named(two_fake_gpus):
    with pytest.raises(ValueError, match=r"--device cuda:2: only 2 CUDA device\(s\) here"):
        resolve_device("cuda:2")

"""The training step on a CUDA device (skipped without one; benchmarks/gpu.py --smoke runs them)."""

import numpy as np
import pytest
import torch

from .test_trainer import make_trainer

pytestmark = pytest.mark.cuda


def cuda_trainer(tiny_data, save_dir, *extra):
    return make_trainer(
        tiny_data,
        save_dir,
        "--device",
        "cuda",
        "--layout",
        "packed",
        "--log-interval",
        "1000",
        *extra,
    )


@pytest.mark.parametrize("precision", [[], ["--bf16"], ["--fp16"]])
def test_updates_never_synchronize_with_the_host(tiny_data, tmp_path, precision):
    """torch's sync debug mode raises on any operation that waits for the GPU: none may happen
    inside an update (the sums are read at log points only)."""
    trainer = cuda_trainer(tiny_data, tmp_path / "ck", *precision)
    trainer.plan.begin_epoch()
    updates = trainer.plan.updates()
    trainer.step(next(updates))  # the first update allocates and warms the caching allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            trainer.step(next(updates))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    reading = trainer.step.read()
    assert np.isfinite(reading.loss) and reading.skipped_updates <= (
        1 if precision == ["--fp16"] else 0
    )
    trainer.close()


def test_packed_and_padded_updates_agree_on_cuda(tiny_data, tmp_path):
    from .test_trainer import step_and_read, update_of

    trainers = [
        make_trainer(
            tiny_data, tmp_path / layout, "--device", "cuda", "--layout", layout, "--dropout", "0"
        )
        for layout in ("padded", "packed")
    ]
    readings = [
        step_and_read(t, update_of(t, np.arange(0, 9), np.arange(20, 31))) for t in trainers
    ]
    assert readings[0].loss == pytest.approx(readings[1].loss, rel=1e-4)
    assert readings[0].grad_norm == pytest.approx(readings[1].grad_norm, rel=1e-3)
    for trainer in trainers:
        trainer.close()


@pytest.mark.slow
def test_compiled_cuda_training_has_zero_recompiles(tiny_data, tmp_path):
    trainer = cuda_trainer(tiny_data, tmp_path / "ck", "--compile", "--bf16", "--max-update", "12")
    try:
        assert trainer.train() == 12
        assert trainer.compiled.recompiles_since_warmup() == 0
    finally:
        torch.compiler.set_stance("default")
        torch.compiler.reset()

import numpy as np
import pytest

from nmt.train.compile import compile_mode, shape_buckets

from .test_trainer import make_trainer


def test_shape_buckets_bound_rows_by_the_budget():
    shapes = shape_buckets(np.array([3, 17, 9]), np.array([5, 12, 30]), max_tokens=256, length_multiple=8, max_sentences=20)
    assert [length for _, length in shapes] == [8, 16, 24, 32]
    assert shapes[0] == (20, 8) and shapes[-1] == (8, 32)
    assert all(rows * length <= 256 for rows, length in shapes)


def test_compile_mode():
    assert compile_mode(device_type="cuda", world_size=1) == "reduce-overhead"
    assert compile_mode(device_type="cuda", world_size=8) == "default"
    assert compile_mode(device_type="cpu", world_size=1) == "default"


@pytest.mark.slow
def test_compiled_training_has_zero_recompiles_after_warm_up(tiny_data, tmp_path):
    import torch

    trainer = make_trainer(tiny_data, tmp_path / "ck", "--compile", "--length-multiple", "16", "--max-update", "12", "--log-format", "simple")
    try:
        state = trainer.train()
        assert state.num_updates == 12
        compiled = trainer.compiled
        assert len(compiled.shapes) >= 2  # several lengths were really met
        assert compiled.recompiles_since_warmup() == 0
    finally:
        torch.compiler.set_stance("default")
        torch.compiler.reset()

import numpy as np
import pytest

from nmt.data.shapes import packed_token_buckets, padded_shapes

from .test_trainer import make_trainer


def test_shape_buckets_bound_rows_by_the_budget():
    longest = int(max(np.max([3, 17, 9]), np.max([5, 12, 30])))
    shapes = padded_shapes(longest, max_tokens=256, length_multiple=8, max_sentences=20)
    assert [length for _, length in shapes] == [8, 16, 24, 32]
    assert shapes[0] == (20, 8) and shapes[-1] == (8, 32)
    assert all(rows * length <= 256 for rows, length in shapes)


def test_packed_buckets_cover_the_budget_in_at_most_16_steps():
    assert packed_token_buckets(max_tokens=4096, length_multiple=8) == list(range(256, 4097, 256))
    assert packed_token_buckets(max_tokens=256, length_multiple=64) == [64, 128, 192, 256]
    assert packed_token_buckets(max_tokens=100, length_multiple=8) == [
        8 * i for i in range(1, 14)
    ]  # 104 >= 100
    assert packed_token_buckets(max_tokens=5, length_multiple=1) == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_compiled_training_has_zero_recompiles_after_warm_up(tiny_data, tmp_path):
    import torch

    trainer = make_trainer(
        tiny_data,
        tmp_path / "ck",
        "--compile",
        "--length-multiple",
        "16",
        "--max-update",
        "12",
        "--log-format",
        "simple",
    )
    try:
        num_updates = trainer.train()
        assert num_updates == 12
        compiled = trainer.compiled
        assert len(compiled.shapes) >= 2  # several lengths were really met
        assert compiled.recompiles_since_warmup() == 0
    finally:
        torch.compiler.set_stance("default")
        torch.compiler.reset()


@pytest.mark.slow
def test_compiled_packed_training_has_zero_recompiles_and_the_eager_losses(
    tiny_data, tmp_path, capsys
):
    import torch

    from .conftest import parse_log, run_subprocess, train_command

    args = ["--layout", "packed", "--max-update", "8", "--dropout", "0", "--length-multiple", "128"]
    eager = run_subprocess([tiny_data, *train_command(tiny_data, tmp_path / "eager", *args)])
    assert eager.returncode == 0, eager.stderr[-3000:]
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--compile", *args)
    try:
        capsys.readouterr()
        num_updates = trainer.train()
        compiled_losses = [r["loss"] for r in parse_log(capsys.readouterr().out)]
        compiled = trainer.compiled
        assert compiled.packed and [tokens for _, tokens in compiled.shapes] == [128, 256]
        assert compiled.frames_after_warmup >= len(compiled.shapes)  # really compiled, per shape
        assert compiled.recompiles_since_warmup() == 0
        # Token-count padding is a tail that belongs to no sample: the same losses as eager.
        eager_losses = [r["loss"] for r in parse_log(eager.stdout)]
        assert num_updates == len(eager_losses) == 8
        np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-4)
    finally:
        torch.compiler.set_stance("default")
        torch.compiler.reset()

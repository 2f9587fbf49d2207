import numpy as np
import pytest

from nmt.data.shapes import packed_token_counts, padded_shapes

from .test_trainer import make_trainer


@pytest.fixture
def compile_cache(tmp_path, monkeypatch):
    """A cache directory of this test's own: every graph is generated unless the test reuses it.
    Dynamo's state and the recompile stance are reset after the test."""
    import torch

    path = tmp_path / "compile-cache"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
    yield path
    torch.compiler.set_stance("default")
    torch.compiler.reset()


def test_shape_buckets_bound_rows_by_the_budget():
    longest = int(max(np.max([3, 17, 9]), np.max([5, 12, 30])))
    shapes = padded_shapes(longest, max_tokens=256, length_multiple=8, max_sentences=20)
    assert [length for _, length in shapes] == [8, 16, 24, 32]
    assert shapes[0] == (20, 8) and shapes[-1] == (8, 32)
    assert all(rows * length <= 256 for rows, length in shapes)


def test_packed_token_counts_are_the_multiples_up_to_the_budget_from_2():
    assert packed_token_counts(max_tokens=4096, length_multiple=8) == list(range(8, 4097, 8))
    assert packed_token_counts(max_tokens=100, length_multiple=8) == [
        8 * i for i in range(1, 14)
    ]  # 104 >= 100
    assert packed_token_counts(max_tokens=5, length_multiple=1) == [2, 3, 4, 5]


def test_the_compile_cache_is_the_users_unless_torchinductor_cache_dir_says(tmp_path, monkeypatch):
    from nmt.train.compile import compile_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = str(tmp_path / "xdg" / "nmt" / "torch-compile")
    assert compile_cache_dir() == expected  # not inductor's /tmp one, which a reboot clears
    assert (tmp_path / "xdg" / "nmt" / "torch-compile").is_dir()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == expected  # inductor reads it from there
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == str(tmp_path / "mine")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file" / "cache"))
    with pytest.raises(
        ValueError, match=r"^--compile: cannot create the compile cache .*file/cache"
    ):
        compile_cache_dir()


def test_cuda_graphs_are_refused_in_one_line(tiny_data, tmp_path, monkeypatch):
    import torch._inductor.config

    from nmt.train.compile import compile_for_shapes

    monkeypatch.setattr(torch._inductor.config.triton, "cudagraphs", True)
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--compile")
    try:
        with pytest.raises(
            ValueError, match=r"^--compile: TORCHINDUCTOR_CUDAGRAPHS=1 .*; unset it$"
        ):
            compile_for_shapes(trainer.step, trainer.plan.static)
    finally:
        trainer.close()


@pytest.mark.slow
def test_compiled_training_has_zero_recompiles_after_warm_up(tiny_data, tmp_path, compile_cache):
    import torch

    from nmt.train.compile import compiled_frames

    trainer = make_trainer(
        tiny_data,
        tmp_path / "ck",
        "--compile",
        "--length-multiple",
        "8",
        "--max-update",
        "12",
        "--log-format",
        "simple",
    )
    frames_before = compiled_frames()
    num_updates = trainer.train()
    assert num_updates == 12
    compiled = trainer.compiled
    shapes = trainer.plan.static.shapes
    assert len(shapes) >= 4  # several lengths were really met
    # Padded shapes stay static: a graph per shape for the encoder layer and one for the decoder
    # layer, whatever the number of layers.
    assert compiled.frames_after_warmup - frames_before == 2 * len(shapes)
    assert compiled.recompiles_since_warmup() == 0
    # Evaluation runs the layers' own forward: nothing compiled, under the no-recompile stance.
    trainer.model.eval()
    batch = trainer.plan.static.warmup_batches()[0]
    with torch.no_grad():
        trainer.step.forward_loss(batch, training=False)
    assert compiled.recompiles_since_warmup() == 0


@pytest.mark.slow
def test_compiled_packed_training_has_zero_recompiles_and_the_eager_losses(
    tiny_data, tmp_path, capsys, compile_cache
):
    import torch

    from nmt.train.compile import compiled_frames

    from ..helpers import parse_log, run_subprocess, train_command

    args = ["--layout", "packed", "--max-update", "8", "--dropout", "0", "--length-multiple", "16"]
    eager = run_subprocess([tiny_data, *train_command(tiny_data, tmp_path / "eager", *args)])
    assert eager.returncode == 0, eager.stderr[-3000:]
    trainer = make_trainer(tiny_data, tmp_path / "ck", "--compile", *args)
    frames_before = compiled_frames()
    capsys.readouterr()
    num_updates = trainer.train()
    compiled_losses = [r["loss"] for r in parse_log(capsys.readouterr().out)]
    compiled = trainer.compiled
    assert compiled.packed and [tokens for _, tokens in compiled.shapes] == list(range(16, 257, 16))
    assert compiled.cache_misses >= 2  # really compiled (forward and backward), in a fresh cache
    # Dynamic token counts: a few graphs for the 16 shapes (packed attention is eager, a graph
    # break inside each layer), not a set per shape.
    assert compiled.frames_after_warmup - frames_before <= 6
    assert compiled.recompiles_since_warmup() == 0
    # Token-count padding is a tail that belongs to no sample: the same losses as eager.
    eager_losses = [r["loss"] for r in parse_log(eager.stdout)]
    assert num_updates == len(eager_losses) == 8
    np.testing.assert_allclose(compiled_losses, eager_losses, rtol=1e-4)

    # A restart (dynamo's state gone, the cache directory kept) generates nothing again.
    torch.compiler.set_stance("default")
    torch.compiler.reset()
    again = make_trainer(tiny_data, tmp_path / "again", "--compile", *args, "--max-update", "1")
    assert again.train() == 1
    assert again.compiled.cache_misses == 0
    assert again.compiled.cache_hits >= compiled.cache_misses

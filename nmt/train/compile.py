"""torch.compile with static shapes: every shape of the run compiled at start-up, then no more.

The shapes, and dummy batches of each, come from the data plan (``nmt.data.shapes``); packed
attention and masks run eager (their sizes depend on the number of samples), everything else is
compiled per shape. After the warm-up, recompiles are an error (``fail_on_recompile``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch._dynamo

from nmt.data.shapes import StaticShapes
from nmt.train.parallel import maybe_no_sync
from nmt.train.step import UpdateStep

logger = logging.getLogger(__name__)


def compiled_frames() -> int:
    """Frames dynamo compiled so far in this process (grows by one per (re)compilation)."""
    return int(torch._dynamo.utils.counters["frames"]["ok"])


@dataclass
class CompiledModel:
    module: torch.nn.Module  # the compiled (DDP-wrapped where several ranks) model
    static: StaticShapes
    frames_after_warmup: int
    warmup_seconds: float

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        return self.static.shapes

    @property
    def packed(self) -> bool:
        return self.static.packed

    def recompiles_since_warmup(self) -> int:
        return compiled_frames() - self.frames_after_warmup


def compile_for_shapes(step: UpdateStep, static: StaticShapes) -> CompiledModel:
    """Compile ``step``'s runner, run forward + backward once per shape on dummy data (no optimizer
    step, RNG untouched, gradients zeroed after), and make the step train through it."""
    warmup_batches = static.warmup_batches()
    device = step.device
    # One graph per shape, and a few spare for the eval/train mode switch of the same module.
    torch._dynamo.config.recompile_limit = max(8, 2 * len(warmup_batches) + 2)
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, 4 * len(warmup_batches) + 8
    )
    try:
        # The default mode, on CUDA too: "reduce-overhead" (CUDA graphs) fails there, because the
        # eager attention between compiled pieces makes each layer replay the same graph while
        # the previous layer's outputs are still needed for backward ("accessing tensor output of
        # CUDAGraphs that has been overwritten by a subsequent run", H200, torch 2.11).
        compiled = torch.compile(step.runner, dynamic=False)
    except Exception as error:  # the platform cannot compile at all
        raise RuntimeError(
            f"--compile: torch.compile is not available here ({error}); run without --compile"
        ) from None
    step.use_runner(compiled)
    started = time.perf_counter()
    compiled.train()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for batch in warmup_batches:
            with maybe_no_sync(compiled, sync=False):
                loss, _ = step.forward_loss(batch)
                (loss * 0.0).backward()
    for parameter in step.model.parameters():
        parameter.grad = None
    result = CompiledModel(compiled, static, compiled_frames(), time.perf_counter() - started)
    torch.compiler.set_stance("fail_on_recompile")
    logger.info(
        "compiled %d shapes in %.1fs; recompiles are now an error",
        len(static.shapes),
        result.warmup_seconds,
    )
    return result

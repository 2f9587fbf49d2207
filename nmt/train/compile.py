"""torch.compile of the training forward, one layer class at a time (regional compilation).

Each encoder and decoder layer class is compiled once, and that one compiled forward serves every
layer of the class; on packed batches (the default) its token count is dynamic, so it serves every
batch shape too (padded shapes stay static: ``nmt.data.shapes``). Compiling the whole model once
per static shape of the data plan (up to 16, each cut into pieces by the eager attention) took 259 s
to the 3rd update of the default model on 2 CPU cores, and more than 5 minutes on an H200.

Only the training forward runs compiled: a layer in evaluation mode (validation, beam search with
its caches) runs its own forward, so evaluation neither compiles nor recompiles.

The packed attention and masks stay eager (their inner sizes depend on the number of samples):
they are graph breaks inside the layer, resumed inside the layer's own frame
(``nested_graph_breaks``) rather than by compiling every caller above them as a frame of its own
(transformer_tiny: 5 frames for the two layer classes instead of 19).

The warm-up runs the data plan's warm-up batches (``nmt.data.shapes``: packed, the smallest and the
largest token count); after it, recompiles are an error (``fail_on_recompile``).

Inductor's caches (generated code, compiled kernels) live in TORCHINDUCTOR_CACHE_DIR when it is
set, else in the user's cache directory (``$XDG_CACHE_HOME/nmt/torch-compile``, by default
``~/.cache/nmt/torch-compile``) rather than inductor's default under /tmp, which a reboot or another
node does not keep: a restarted or resumed run reuses the code the last one generated. It still
traces (dynamo, and AOTAutograd, whose cache the CPU dropout's autograd.Function turns off).

CUDA graphs (torch.compile's ``mode="reduce-overhead"``, or TORCHINDUCTOR_CUDAGRAPHS=1) are refused.
A CUDA graph is recorded for each input shape: with dynamic token counts that is a recording for
almost every batch. And the eager attention between the compiled pieces breaks them: each layer
replays a graph while tensors the previous replay returned are still needed for backward ("accessing
tensor output of CUDAGraphs that has been overwritten by a subsequent run", H200, torch 2.11).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo
import torch._inductor.config
import torch.fx.experimental._config

from nmt.data.shapes import StaticShapes
from nmt.train.parallel import maybe_no_sync
from nmt.train.step import UpdateStep

logger = logging.getLogger(__name__)


def compiled_frames() -> int:
    """Frames dynamo compiled so far in this process (grows by one per (re)compilation)."""
    return int(torch._dynamo.utils.counters["frames"]["ok"])


def inductor_cache_counts() -> tuple[int, int]:
    """(hits, misses) of inductor's FX graph cache so far in this process."""
    counts = torch._dynamo.utils.counters["inductor"]
    return int(counts["fxgraph_cache_hit"]), int(counts["fxgraph_cache_miss"])


@dataclass
class CompiledModel:
    static: StaticShapes
    frames_after_warmup: int
    warmup_seconds: float
    cache_hits: int  # graphs the warm-up found in inductor's cache
    cache_misses: int  # graphs it generated
    cache_dir: str

    @property
    def shapes(self) -> tuple[tuple[int, int], ...]:
        return self.static.shapes

    @property
    def packed(self) -> bool:
        return self.static.packed

    def recompiles_since_warmup(self) -> int:
        return compiled_frames() - self.frames_after_warmup


def compile_cache_dir() -> str:
    """Where inductor keeps its caches: TORCHINDUCTOR_CACHE_DIR when set, else (and then set to it)
    the user's cache directory. Created here, so a path that cannot be written is one line."""
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "nmt", "torch-compile")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"--compile: cannot create the compile cache {path} ({error.strerror}); "
            "set TORCHINDUCTOR_CACHE_DIR to a writable directory"
        ) from None
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


class _TrainingForward:
    """A layer's forward: the compiled one in training, the module's own in evaluation. With
    ``token_bounds``, the token axis of a packed input (N, D) is dynamic within them."""

    def __init__(
        self,
        layer: torch.nn.Module,
        compiled: Callable[..., Any],
        *,
        token_bounds: tuple[int, int] | None,
    ) -> None:
        self.layer = layer
        self.compiled = compiled
        self.token_bounds = token_bounds

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not self.layer.training:
            return type(self.layer).forward(self.layer, x, *args, **kwargs)
        if self.token_bounds is not None:
            low, high = self.token_bounds
            torch._dynamo.mark_dynamic(x, 0, min=low, max=high)
        return self.compiled(self.layer, x, *args, **kwargs)


def compile_layers(model: torch.nn.Module, static: StaticShapes) -> None:
    """Route the training forward of every encoder and decoder layer through one compiled forward
    per layer class: the same graphs for every layer, and on packed batches for every shape."""
    low, high = static.shapes[0][1], static.shapes[-1][1]
    token_bounds = (low, high) if static.packed and low < high else None
    for layers in (model.encoder.layers, model.decoder.layers):
        compiled: dict[type, Callable[..., Any]] = {}
        for layer in layers:
            kind = type(layer)
            if kind not in compiled:
                compiled[kind] = torch.compile(kind.forward, dynamic=static.packed)
            layer.forward = _TrainingForward(layer, compiled[kind], token_bounds=token_bounds)


def compile_for_shapes(step: UpdateStep, static: StaticShapes) -> CompiledModel:
    """Compile ``step``'s layers, run forward + backward on the smallest and the largest shape on
    dummy data (no optimizer step, RNG untouched, gradients zeroed after); recompiles are then an
    error."""
    if torch._inductor.config.triton.cudagraphs:
        raise ValueError(
            "--compile: TORCHINDUCTOR_CUDAGRAPHS=1 (CUDA graphs) is not supported: a graph would be "
            "recorded for almost every batch shape, and the eager attention between compiled layers "
            "overwrites their outputs; unset it"
        )
    cache_dir = compile_cache_dir()
    device = step.device
    warmup = static.warmup_batches()
    # A graph per warm-up batch at most (one per padded shape), and spare.
    torch._dynamo.config.recompile_limit = max(8, len(warmup) + 2)
    torch._dynamo.config.accumulated_recompile_limit = max(
        torch._dynamo.config.accumulated_recompile_limit, 4 * len(warmup) + 8
    )
    hits, misses = inductor_cache_counts()
    started = time.perf_counter()
    compile_layers(step.model, static)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch._dynamo.config.patch(nested_graph_breaks=True))
        # One symbol per dynamic size even where two are equal in a warm-up batch: duck sizing
        # would guard on their equality, a recompile later.
        stack.enter_context(torch.fx.experimental._config.patch(use_duck_shape=False))
        stack.enter_context(
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        )
        step.runner.train()
        for batch in warmup:
            with maybe_no_sync(step.runner, sync=False):
                loss, _ = step.forward_loss(batch)
                (loss * 0.0).backward()
    for parameter in step.model.parameters():
        parameter.grad = None
    now_hits, now_misses = inductor_cache_counts()
    result = CompiledModel(
        static,
        frames_after_warmup=compiled_frames(),
        warmup_seconds=time.perf_counter() - started,
        cache_hits=now_hits - hits,
        cache_misses=now_misses - misses,
        cache_dir=cache_dir,
    )
    torch.compiler.set_stance("fail_on_recompile")
    # benchmarks/gpu.py reads "compiled N shapes in Xs" from this line.
    logger.info(
        "compiled %d shapes in %.1fs (they serve all %d; %d graphs found in the compile cache %s, "
        "%d generated); recompiles are now an error",
        len(warmup),
        result.warmup_seconds,
        len(static.shapes),
        result.cache_hits,
        cache_dir,
        result.cache_misses,
    )
    return result

"""The host's share of a training update (issue 47): operations per update and host time, by phase.

    python benchmarks/host_overhead.py [--archs transformer_tiny,transformer_base]
        [--layouts packed,padded] [--max-tokens 2048] [--rounds 2 --updates 2] [--threads N]
        [--device cpu|cuda] [--bf16]

For each model and layout, on the bundled Multi30k (``benchmarks/train_throughput.py``'s dataset),
through nmt's real ``Trainer`` (its data plan and ``UpdateStep``):

- aten operations per update by phase, counted below autograd by a ``TorchDispatchMode`` over one
  update (deterministic and machine-independent: the figure to compare across changes);
- host milliseconds per update by phase (on CUDA the host's own time: nothing is waited for);
- the whole update as ``nmt-train`` runs it (the next update from the data plan, the update step;
  --rounds blocks of --updates updates, each ending with a device read as a log point does)
  against the step alone (forward, loss and backward of the same micro-batches, already collated,
  right after each block), and their ratio;
- the time to collate one micro-batch, whichever thread does it.

Phases: ``collate`` (the data plan's next update: micro-batches, collation), ``transfer+masks``
(host-to-device copies, packed masks), ``forward`` (the model and the fused loss), ``backward``,
``optimizer`` (norm, clipping, the AdamW step, zeroing), ``bookkeeping`` (loss sums, the
schedule, the rest of the update; operations: the device read's shared by --log-interval updates).
The script measures the code it runs with: run it before and after a change and compare.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import DATA, ensure_data  # noqa: E402

from nmt.results import write_results  # noqa: E402

PHASES = ("collate", "transfer+masks", "forward", "backward", "optimizer", "bookkeeping")


class PhaseClock:
    """Exclusive host time and aten operations per phase: a phase entered inside another is
    subtracted from it, and an operation counts for the innermost phase (backward, whatever the
    stack, while autograd's engine runs)."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, float]] = []
        self.seconds: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.stack.append((name, time.perf_counter()))
        try:
            yield
        finally:
            _, started = self.stack.pop()
            elapsed = time.perf_counter() - started
            self.seconds[name] += elapsed
            if self.stack:
                self.seconds[self.stack[-1][0]] -= elapsed

    def current(self) -> str:
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return self.stack[-1][0] if self.stack else "bookkeeping"

    @contextlib.contextmanager
    def wrapping(self, targets: list[tuple[Any, str, str]]) -> Iterator[None]:
        """Each ``owner.name`` of ``targets`` (owner, name, phase) timed as its phase inside the
        block, put back after it."""
        # (owner, name, original, whether the owner itself held it: else it came from its class)
        originals = [(o, n, getattr(o, n), n in vars(o)) for o, n, _ in targets]
        for (owner, name, original, _), (_, _, phase) in zip(originals, targets):
            setattr(owner, name, self._timed(original, phase))
        try:
            yield
        finally:
            for owner, name, original, own in originals:
                if own:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)

    def _timed(self, original: Callable[..., Any], phase: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(phase):
                return original(*args, **kwargs)

        return timed


class OpCounter(TorchDispatchMode):
    def __init__(self, clock: PhaseClock) -> None:
        super().__init__()
        self.clock = clock

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.clock.ops[self.clock.current()] += 1
        return func(*args, **(kwargs or {}))


def make_trainer(save_dir: str, args: argparse.Namespace, arch: str, layout: str) -> Any:
    from nmt.data import load_manifest
    from nmt.train.trainer import Trainer
    from nmt_cli.train import build_parser, make_configs

    flags = [DATA, "--save-dir", save_dir, "--arch", arch, "--layout", layout]
    flags += ["--max-tokens", str(args.max_tokens), "--device", args.device, "--seed", "1"]
    flags += ["--log-interval", str(args.log_interval), "--clip-norm", "1.0"]
    flags += ["--bf16"] if args.bf16 else []
    manifest = load_manifest(DATA)
    train_cfg, model_cfg = make_configs(build_parser().parse_args(flags), manifest)
    return Trainer(train_cfg, model_cfg, manifest=manifest)


def phase_targets(trainer: Any) -> list[tuple[Any, str, str]]:
    """What ``PhaseClock.wrapping`` times: the step's parts and every backward."""
    import nmt.train.step as step_module

    step = trainer.step
    return [
        (step, "forward_loss", "forward"),
        (step, "masks", "transfer+masks"),
        (step_module, "move_batch", "transfer+masks"),
        (step, "_step", "optimizer"),
        (torch.Tensor, "backward", "backward"),
    ]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_updates(trainer: Any, updates: Iterator[Any], clock: PhaseClock, count: int) -> list[Any]:
    """``count`` whole updates as the training loop runs them; the updates run."""
    done = []
    for _ in range(count):
        with clock.phase("collate"):
            update = next(updates)
        with clock.phase("bookkeeping"):
            trainer.step(update)
        done.append(update)
    return done


def step_alone(trainer: Any, updates: list[Any]) -> float:
    """Seconds for forward, loss and backward of the updates' micro-batches (no optimizer step)."""
    step = trainer.step
    device = trainer.session.device
    synchronize(device)
    started = time.perf_counter()
    for update in updates:
        for micro in update.micro_batches:
            torch.manual_seed(micro.seed)
            loss, _ = step.forward_loss(micro.batch)
            loss.backward()
        step.optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return time.perf_counter() - started


def collation_seconds(trainer: Any, updates: list[Any]) -> float:
    """Seconds to collate one of the updates' micro-batches, in line (whichever thread does it in
    a run: off the critical path when it is made ahead)."""
    micro = [m for update in updates for m in update.micro_batches]
    started = time.perf_counter()
    for m in micro:
        trainer.plan.micro_batches(m.indices)
    return (time.perf_counter() - started) / len(micro)


def measure(args: argparse.Namespace, arch: str, layout: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as save_dir:
        trainer = make_trainer(save_dir, args, arch, layout)
        try:
            trainer.plan.begin_epoch()
            updates = trainer.plan.updates()
            device = trainer.session.device
            run_updates(trainer, updates, PhaseClock(), args.warmup)
            trainer.step.read()
            ops_clock = PhaseClock()  # one update with every aten operation counted
            with ops_clock.wrapping(phase_targets(trainer)), OpCounter(ops_clock):
                run_updates(trainer, updates, ops_clock, 1)
                with ops_clock.phase("read"):
                    trainer.step.read()
            ops_clock.ops["bookkeeping"] += ops_clock.ops.pop("read") / args.log_interval
            # Timed: blocks of whole updates, each ending with a device read (a log point), each
            # followed by the step alone on its batches, so that load from other processes falls
            # on both alike.
            clock, whole, alone, done = PhaseClock(), 0.0, 0.0, []
            for _ in range(args.rounds):
                with clock.wrapping(phase_targets(trainer)):
                    synchronize(device)
                    started = time.perf_counter()
                    block = run_updates(trainer, updates, clock, args.updates)
                    trainer.step.read()
                    synchronize(device)
                    whole += time.perf_counter() - started
                alone += step_alone(trainer, block)
                done += block
            collation = collation_seconds(trainer, done)
        finally:
            trainer.close()
    return {
        "ops": ops_clock.ops,
        "ms": {phase: 1000 * clock.seconds[phase] / len(done) for phase in PHASES},
        "whole": whole,
        "alone": alone,
        "tokens": sum(update.num_tokens for update in done),
        "updates": len(done),
        "collation": collation,
    }


def report(name: str, result: dict[str, Any]) -> None:
    ops, ms = result["ops"], result["ms"]
    total_ops = sum(ops[p] for p in PHASES)
    host_ops = total_ops - ops["forward"] - ops["backward"]
    outside = sum(ms[p] for p in PHASES if p not in ("forward", "backward"))
    print(f"\n{name}")
    print(f"  {'phase':<16}{'aten ops/update':>16}{'host ms/update':>16}")
    for phase in PHASES:
        print(f"  {phase:<16}{ops[phase]:>16,.0f}{ms[phase]:>16.2f}")
    print(f"  {'total':<16}{total_ops:>16,.0f}{sum(ms.values()):>16.2f}")
    print(f"  {'outside fwd/bwd':<16}{host_ops:>16,.0f}{outside:>16.2f}")
    whole, alone, tokens, updates = (result[k] for k in ("whole", "alone", "tokens", "updates"))
    print(
        f"  whole update {1000 * whole / updates:.1f} ms ({tokens / whole:,.0f} tgt tok/s) | "
        f"step alone {1000 * alone / updates:.1f} ms ({tokens / alone:,.0f} tgt tok/s) | "
        f"whole/alone {whole / alone:.3f}"
    )
    print(f"  collating one micro-batch (any thread) {1000 * result['collation']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", default="transformer_tiny,transformer_base")
    parser.add_argument("--layouts", default="packed,padded")
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--updates", type=int, default=2, help="whole updates per timed block")
    parser.add_argument("--rounds", type=int, default=2, help="timed blocks per row")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--log-interval", type=int, default=10, help="the device read's operations are shared by"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--results", help="also write the totals as a results file (nmt.results)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ensure_data()
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[:3]
    print(
        f"torch {torch.__version__}, {args.device}, {args.threads} threads, load {' '.join(load)}, "
        f"--max-tokens {args.max_tokens}, {args.rounds} x {args.updates} updates after {args.warmup}"
    )
    operations, rows = {}, []
    for arch in args.archs.split(","):
        for layout in args.layouts.split(","):
            result = measure(args, arch, layout)
            report(f"{arch}, {layout}", result)
            ops = result["ops"]
            total = round(sum(ops[p] for p in PHASES))
            host = round(total - ops["forward"] - ops["backward"])
            operations[f"{arch}, {layout}"] = {"total": total, "outside_forward_backward": host}
            ratio = result["whole"] / result["alone"]
            rows.append([f"{arch}, {layout}", f"{total:,}", f"{host:,}", f"{ratio:.3f}"])
    if args.results:
        columns = ["model, layout", "aten ops/update", "outside fwd/bwd", "whole/alone (time)"]
        table = {"columns": columns, "rows": rows}
        write_results(args.results, figures={"operations": operations, "table": table})
    with open("/proc/loadavg") as handle:
        print(f"\nload at the end {' '.join(handle.read().split()[:3])}")


if __name__ == "__main__":
    main()

"""Training throughput (target tokens/s) on the bundled Multi30k, side by side.

    python benchmarks/train_throughput.py [--updates 8] [--skip-compile] [--skip-processes]
        [--baseline-tree OLD_CHECKOUT --repeats 3]

Model: transformer_tiny (3+3 layers, 256 dim, FFN 1024, 4 heads, shared embeddings, 8k joint
SentencePiece vocabulary), --max-tokens 4096, fp32, dropout 0.1: the fairseq reference setting.
Rows: padded + random batches (a plain PyTorch loop: shuffled samples cut under the budget),
padded + our sampler, packed + our sampler, each also with --compile (static shapes; warm-up time
reported separately, steady state measured); then 1 vs 2 CPU processes (torchrun, gloo), and the
same nmt-train runs of another checkout (--baseline-tree) alternating with this one's: before/after
a change in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "runs", "bench-data")
# Measured on this 2-core machine (issue 5): fairseq 0.12.2, same model and data, fp32.
FAIRSEQ_TOKENS_PER_SECOND = 2230.0


def ensure_data() -> None:
    if not os.path.exists(os.path.join(DATA, "manifest.json")):
        mk = os.path.join(ROOT, "data", "multi30k")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "nmt_cli.preprocess",
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                f"{mk}/train",
                "--validpref",
                f"{mk}/val",
                "--destdir",
                DATA,
                "--overwrite",
            ],
            check=True,
        )


# Spelled out rather than left to --arch transformer_tiny: the preset is now smaller (nmt-train's
# Multi30k defaults), and the fairseq figures and the --baseline-tree runs are of this model.
REFERENCE_MODEL = [
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "3",
    "--encoder-embed-dim",
    "256",
    "--decoder-embed-dim",
    "256",
    "--encoder-ffn-embed-dim",
    "1024",
    "--decoder-ffn-embed-dim",
    "1024",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
    "--dropout",
    "0.1",
    "--share-all-embeddings",
    "--max-tokens",
    "4096",
]


def make_trainer(save_dir: str, *extra: str):
    from nmt.data import load_manifest
    from nmt.train.trainer import Trainer
    from nmt_cli.train import build_parser, make_configs

    args = [DATA, "--save-dir", save_dir, *REFERENCE_MODEL, *extra]
    manifest = load_manifest(DATA)
    train_cfg, model_cfg = make_configs(build_parser().parse_args(args), manifest)
    return Trainer(train_cfg, model_cfg, manifest=manifest)


def random_batches(trainer, *, seed: int) -> list[np.ndarray]:
    """What a plain loop does: shuffle, then cut greedily under the padded token budget."""
    from nmt.data.batching import greedy_offsets, round_up

    # Lengths rounded as the compiled shapes round them (a no-op without --compile).
    dataset = trainer.plan.current.dataset
    src = round_up(np.asarray(dataset.src_lengths, dtype=np.int64), trainer.plan.length_multiple)
    tgt = round_up(np.asarray(dataset.tgt_lengths, dtype=np.int64), trainer.plan.length_multiple)
    order = np.random.default_rng(seed).permutation(src.shape[0])
    offsets = greedy_offsets(src[order], tgt[order], trainer.plan.batching.max_tokens, packed=False)
    return [order[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def measure(
    trainer, batches: list[np.ndarray], *, warmup: int, updates: int
) -> tuple[float, float]:
    """(target tokens/s, padding ratio) over ``updates`` updates after ``warmup`` untimed ones."""
    from nmt.data import Update

    tgt = trainer.plan.current.dataset.tgt_lengths

    def run(batch: np.ndarray):
        return trainer.step(
            Update(trainer.plan.micro_batches(batch), int(tgt[batch].sum()), len(batch))
        )

    for batch in batches[:warmup]:
        run(batch)
    tokens = padded = real = 0
    started = time.perf_counter()
    for batch in batches[warmup : warmup + updates]:
        stats = run(batch)
        tokens += stats.ntokens
        padded += stats.padded_tokens
        real += stats.real_tokens
    elapsed = time.perf_counter() - started
    return tokens / elapsed, 1.0 - real / max(padded, 1)


def compile_for(trainer, batches: list[np.ndarray]) -> float:
    """Compile exactly the shapes of the measured batches; returns the warm-up seconds."""
    from nmt.data.shapes import StaticShapes
    from nmt.train.compile import compile_for_shapes
    from nmt.train.step import to_device

    static = trainer.plan.static
    data = trainer.plan.current.dataset
    if static.packed:
        sizes = [int(max(data.src_lengths[b].sum(), data.tgt_lengths[b].sum())) for b in batches]
    else:
        sizes = [int(max(data.src_lengths[b].max(), data.tgt_lengths[b].max())) for b in batches]
    needed = StaticShapes(
        tuple(sorted({static.shape_for(size) for size in sizes}, key=lambda s: s[1])), static.packed
    )
    trainer.compiled = compile_for_shapes(
        trainer.step.wrapped,
        needed,
        trainer.step.forward_loss,
        device=trainer.session.device,
        world_size=1,
        to_device=lambda batch: to_device(batch, trainer.session.device),
    )
    trainer.step.runner = trainer.compiled.module
    return trainer.compiled.warmup_seconds


def in_process_rows(args: argparse.Namespace) -> list[tuple[str, float, float, str]]:
    import torch

    rows = []
    configs = [
        ("padded + random batches", "padded", "random"),
        ("padded + our sampler", "padded", "sampler"),
        ("packed + our sampler", "packed", "sampler"),
    ]
    for compiled in [False] if args.skip_compile else [False, True]:
        for label, layout, batching in configs:
            name = label + (" + compile" if compiled else "")
            with tempfile.TemporaryDirectory() as tmp:
                extra = ["--layout", layout] + (
                    ["--compile", "--length-multiple", "16"] if compiled else []
                )
                trainer = make_trainer(tmp, *extra)
                if batching == "random":
                    batches = random_batches(trainer, seed=1)
                else:
                    batches = trainer.plan.current.rank_batches.to_list()
                batches = batches[: args.warmup + args.updates]
                note = ""
                if compiled:
                    note = f"warm-up {compile_for(trainer, batches):.0f} s for {len(trainer.compiled.shapes)} shapes"
                tokens_per_s, padding = measure(
                    trainer, batches, warmup=args.warmup, updates=args.updates
                )
                rows.append((name, tokens_per_s, padding, note))
                print(f"  {name}: {tokens_per_s:,.0f} tok/s", flush=True)
            if compiled:
                torch.compiler.set_stance("default")
                torch.compiler.reset()
    return rows


# Runs a source tree's cli/train.py with that tree first on sys.path, so an older checkout (a git
# worktree of the commit before a change) is measured in the same run as this one.
LAUNCH = (
    "import runpy, sys; tree = sys.argv[1]; sys.path.insert(0, tree); "
    "sys.argv = ['nmt-train', *sys.argv[2:]]; runpy.run_path(tree + '/cli/train.py', run_name='__main__')"
)


def nmt_train_tokens_per_second(tree: str, procs: int, args: argparse.Namespace) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        train_args = [
            DATA,
            "--save-dir",
            tmp,
            *REFERENCE_MODEL,
            "--max-update",
            str(args.warmup + args.updates),
            "--log-format",
            "json",
            "--log-interval",
            "1",
            "--layout",
            args.process_layout,
        ]
        launch = ["-c", LAUNCH, tree, *train_args]
        if procs == 1:
            command = [sys.executable, *launch]
        else:
            # torchrun runs a script: the launcher goes through a temporary file.
            script = os.path.join(tmp, "launch.py")
            with open(script, "w") as handle:
                handle.write(LAUNCH)
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                script,
                tree,
                *train_args,
            ]
        env = {**os.environ, "OMP_NUM_THREADS": str(2 // procs)}
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-2000:])
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    timed = [r for r in records if r.get("kind") == "train"][args.warmup :]
    # wps is per log interval (1 update): tokens / wall time of that update, all ranks together.
    seconds = sum(r["ntokens"] / r["wps"] for r in timed)
    return sum(r["ntokens"] for r in timed) / seconds


def process_rows(args: argparse.Namespace) -> list[tuple[str, float, float, str]]:
    """nmt-train as a process, 1 x 2 threads and 2 x 1 (torchrun); with --baseline-tree, the same
    runs of that tree alternate with this one's (median of --repeats), and the ratio is printed."""
    trees = [("", ROOT)] + ([(" [baseline]", args.baseline_tree)] if args.baseline_tree else [])
    rows = []
    for procs in (1, 2):
        measured: dict[str, list[float]] = {label: [] for label, _ in trees}
        for _ in range(args.repeats):
            for label, tree in trees:
                measured[label].append(nmt_train_tokens_per_second(tree, procs, args))
        name = f"{procs} process{'es' if procs > 1 else ''} x {2 // procs} thread{'s' if procs == 1 else ''} (nmt-train)"
        for label, _ in trees:
            runs = measured[label]
            note = f"{args.process_layout} + our sampler; runs: " + ", ".join(
                f"{r:,.0f}" for r in runs
            )
            rows.append((name + label, float(np.median(runs)), float("nan"), note))
            print(f"  {rows[-1][0]}: {rows[-1][1]:,.0f} tok/s", flush=True)
        if args.baseline_tree:
            ratio = np.median(measured[""]) / np.median(measured[" [baseline]"])
            rows.append(
                (
                    f"  this tree / baseline ({procs} proc)",
                    float("nan"),
                    float("nan"),
                    f"{ratio:.3f}x",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-processes", action="store_true")
    parser.add_argument("--process-layout", default="packed", choices=("padded", "packed"))
    parser.add_argument(
        "--baseline-tree",
        help="another checkout (e.g. a git worktree of an older commit) to run beside this one",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="nmt-train runs per tree and process count (alternating)",
    )
    args = parser.parse_args()
    ensure_data()
    print("measuring ...", flush=True)
    rows = in_process_rows(args) + ([] if args.skip_processes else process_rows(args))
    baseline = rows[0][1]
    print(
        f"\nMulti30k en-de, transformer_tiny, --max-tokens 4096, fp32, {args.updates} timed updates each"
    )
    print(
        f"{'configuration':<46} {'tgt tok/s':>10} {'vs random':>9} {'vs fairseq':>10} {'padding':>8}  note"
    )
    for name, tokens_per_s, padding, note in rows:
        pad = "" if np.isnan(padding) else f"{padding:.1%}"
        if np.isnan(tokens_per_s):
            print(f"{name:<46} {'-':>10} {'-':>9} {'-':>10} {pad:>8}  {note}")
            continue
        print(
            f"{name:<46} {tokens_per_s:>10,.0f} {tokens_per_s / baseline:>8.2f}x {tokens_per_s / FAIRSEQ_TOKENS_PER_SECOND:>9.2f}x {pad:>8}  {note}"
        )
    print(
        f"fairseq 0.12.2 reference on this machine: {FAIRSEQ_TOKENS_PER_SECOND:,.0f} tok/s (target: 1.3x = {1.3 * FAIRSEQ_TOKENS_PER_SECOND:,.0f})"
    )


if __name__ == "__main__":
    main()

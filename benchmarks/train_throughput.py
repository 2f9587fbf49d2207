"""Training throughput (target tokens/s) on the bundled Multi30k, side by side.

    python benchmarks/train_throughput.py [--updates 8] [--skip-compile] [--skip-processes]
        [--baseline-tree OLD_CHECKOUT --repeats 3]

Model: 3+3 layers, 256 dim, FFN 1024, 4 heads, shared embeddings, 8k joint SentencePiece
vocabulary, --max-tokens 4096, fp32, dropout 0.1: the fairseq reference setting.
Two sections, each against a plain PyTorch loop (``nn.Transformer``, ``F.cross_entropy``, Adam, on
shuffled batches cut under the padded budget) measured the same way in the same run:
- in one process, the update step only, the rows taking turns update by update (load from other
  processes falls on all alike): the plain loop, our step on its batches, padded + our sampler,
  packed + our sampler; each also with --compile unless --skip-compile (warm-up reported apart);
- whole processes taking turns, --repeats rounds, medians: the plain loop in a process of its own,
  nmt-train 1 x 2 threads and 2 x 1 (torchrun, gloo), their throughput read from nmt-train's own
  log records after --warmup updates; with --baseline-tree, another checkout's nmt-train beside this
  one's (before/after a change in one run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from nmt.results import write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "runs", "bench-data")


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


Stepper = (
    "Callable[[int], tuple[int, int, int]]"  # batch i -> (target tokens, padded, real) once done
)


def nmt_stepper(trainer, batches: list[np.ndarray]):
    """One update of our step on batch i, waited for (the device read a log point makes)."""
    from nmt.data import Update

    tgt = trainer.plan.current.dataset.tgt_lengths

    def step(i: int) -> tuple[int, int, int]:
        micro = trainer.plan.micro_batches(batches[i])
        update = Update(
            micro, int(tgt[batches[i]].sum()), len(batches[i]), epoch=1, ends_epoch=False
        )
        stats = trainer.step(update)
        trainer.step.read()
        return stats.ntokens, stats.padded_tokens, stats.real_tokens

    return step


def measure_interleaved(
    steppers: dict[str, Any], *, warmup: int, updates: int
) -> dict[str, tuple[float, float]]:
    """(target tokens/s, padding ratio) of each stepper, taking turns update by update, so that
    load from other processes falls on all of them alike."""
    for i in range(warmup):
        for step in steppers.values():
            step(i)
    totals = {name: [0.0, 0, 0, 0] for name in steppers}  # seconds, tokens, padded, real
    for i in range(warmup, warmup + updates):
        for name, step in steppers.items():
            started = time.perf_counter()
            tokens, padded, real = step(i)
            total = totals[name]
            total[0] += time.perf_counter() - started
            total[1] += tokens
            total[2] += padded
            total[3] += real
    return {name: (t[1] / t[0], 1.0 - t[3] / max(t[2], 1)) for name, t in totals.items()}


def measure(
    trainer, batches: list[np.ndarray], *, warmup: int, updates: int
) -> tuple[float, float]:
    """One stepper alone (the compiled rows: compilation is process-wide)."""
    return measure_interleaved({"": nmt_stepper(trainer, batches)}, warmup=warmup, updates=updates)[
        ""
    ]


def gemm_floor_stepper(trainer, batches: list[np.ndarray]):
    """The matrix products of our step on batch i, alone: every linear layer's forward and its two
    backward products, and the output projection's three (the fused loss), with the shapes the
    real step has (recorded by hooks on a forward of each batch). No training step can beat it."""
    import torch
    from torch import nn

    shapes: list[list[tuple[int, int, int]]] = []  # per batch: (rows, in, out) of every product
    recording: list[tuple[int, int, int]] = []

    def record(module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: torch.Tensor) -> None:
        recording.append(
            (inputs[0].numel() // module.in_features, module.in_features, module.out_features)
        )

    linears = [
        m
        for m in trainer.model.modules()
        if isinstance(m, nn.Linear) and m is not trainer.model.output_projection
    ]
    handles = [m.register_forward_hook(record) for m in linears]
    tgt = trainer.plan.current.dataset.tgt_lengths
    with torch.no_grad():
        for indices in batches:
            recording.clear()
            micro = trainer.plan.micro_batches(indices)
            for part in micro:
                trainer.step.forward_loss(part.batch, training=False)
            projection = trainer.model.output_projection
            recording.append(
                (int(tgt[indices].sum()), projection.in_features, projection.out_features)
            )
            shapes.append(list(recording))
    for handle in handles:
        handle.remove()

    # Operands allocated once, outside the timing (sliced to each product's rows): random
    # numbers drawn per product would cost more than the products themselves.
    most_rows: dict[tuple[int, int], int] = {}
    for batch_shapes in shapes:
        for rows, fan_in, fan_out in batch_shapes:
            key = (fan_in, fan_out)
            most_rows[key] = max(most_rows.get(key, 0), rows)
    operands = {
        (fan_in, fan_out): (
            torch.randn(rows, fan_in),
            torch.randn(fan_out, fan_in),
            torch.randn(rows, fan_out),
        )
        for (fan_in, fan_out), rows in most_rows.items()
    }

    def step(i: int) -> tuple[int, int, int]:
        for rows, fan_in, fan_out in shapes[i]:
            x, w, grad = operands[(fan_in, fan_out)]
            x, grad = x[:rows], grad[:rows]
            x @ w.T  # forward
            grad @ w  # gradient of the input
            grad.T @ x  # gradient of the weight
        tokens = int(tgt[batches[i]].sum())
        return tokens, 1, 1  # packed: no padding

    return step


def plain_loop_stepper(trainer, batches: list[np.ndarray]):
    """The reference: the training loop a PyTorch user writes with ``nn.Transformer`` (same sizes:
    3+3 x 256, FFN 1024, 4 heads, dropout 0.1, shared embeddings, sinusoidal positions, Adam,
    clip 1.0, label-smoothed ``F.cross_entropy``), on shuffled batches cut under the padded budget."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from nmt.data.collate import collate
    from nmt.data.spm import BOS_ID, PAD_ID

    dataset = trainer.plan.current.dataset
    vocab = trainer.model_cfg.src_vocab_size
    dim = 256
    torch.manual_seed(1)
    embed = nn.Embedding(vocab, dim, padding_idx=PAD_ID)
    transformer = nn.Transformer(dim, 4, 3, 3, 1024, dropout=0.1, batch_first=True).train()
    half = dim // 2
    freqs = torch.exp(torch.arange(half) * -(np.log(10000.0) / (half - 1)))
    angles = torch.arange(1024)[:, None] * freqs[None, :]
    positions = torch.cat([angles.sin(), angles.cos()], dim=1)
    params = list(embed.parameters()) + list(transformer.parameters())
    optimizer = torch.optim.Adam(params, lr=5e-4, betas=(0.9, 0.98))

    def step(i: int) -> tuple[int, int, int]:
        batch = collate([dataset[int(j)] for j in batches[i]], pad_id=PAD_ID, bos_id=BOS_ID)
        src, prev, target = batch["src_tokens"], batch["prev_output_tokens"], batch["target"]
        source = embed(src) * dim**0.5 + positions[: src.shape[1]]
        decoder_in = embed(prev) * dim**0.5 + positions[: prev.shape[1]]
        causal = torch.ones(prev.shape[1], prev.shape[1], dtype=torch.bool).triu(1)  # True: masked
        hidden = transformer(
            source,
            decoder_in,
            tgt_mask=causal,
            src_key_padding_mask=src == PAD_ID,
            tgt_key_padding_mask=prev == PAD_ID,
            memory_key_padding_mask=src == PAD_ID,
            tgt_is_causal=True,
        )
        logits = hidden @ embed.weight.T  # (B, T, V), tied output
        ntokens = int((target != PAD_ID).sum())
        loss = (
            F.cross_entropy(
                logits.view(-1, vocab),
                target.view(-1),
                ignore_index=PAD_ID,
                label_smoothing=0.1,
                reduction="sum",
            )
            / ntokens
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return ntokens, src.numel() + target.numel(), int(batch["src_lengths"].sum()) + ntokens

    return step


def compile_for(trainer, batches: list[np.ndarray]) -> float:
    """Compile exactly the shapes of the measured batches; returns the warm-up seconds."""
    from nmt.data.shapes import StaticShapes
    from nmt.train.compile import compile_for_shapes

    static = trainer.plan.static
    data = trainer.plan.current.dataset
    if static.packed:
        sizes = [int(max(data.src_lengths[b].sum(), data.tgt_lengths[b].sum())) for b in batches]
    else:
        sizes = [int(max(data.src_lengths[b].max(), data.tgt_lengths[b].max())) for b in batches]
    needed = StaticShapes(
        tuple(sorted({static.shape_for(size) for size in sizes}, key=lambda s: s[1])), static.packed
    )
    trainer.compiled = compile_for_shapes(trainer.step, needed)
    return trainer.compiled.warmup_seconds


def in_process_rows(args: argparse.Namespace) -> list[tuple[str, float, float, str]]:
    import torch

    configs = [
        ("padded + random batches", "padded", "random"),
        ("padded + our sampler", "padded", "sampler"),
        ("packed + our sampler", "packed", "sampler"),
    ]
    count = args.warmup + args.updates
    with contextlib.ExitStack() as stack:
        steppers, notes = {}, {}
        for label, layout, batching in configs:
            trainer = make_trainer(
                stack.enter_context(tempfile.TemporaryDirectory()), "--layout", layout
            )
            stack.callback(trainer.close)
            if batching == "random":
                batches = random_batches(trainer, seed=1)[:count]
                if not steppers:  # the reference, on the same batches
                    steppers["plain PyTorch loop (nn.Transformer)"] = plain_loop_stepper(
                        trainer, batches
                    )
                    notes["plain PyTorch loop (nn.Transformer)"] = "random batches, padded"
            else:
                batches = trainer.plan.current.rank_batches.to_list()[:count]
            steppers[label] = nmt_stepper(trainer, batches)
            if layout == "packed":
                floor = "its matrix products alone (a floor)"
                steppers[floor] = gemm_floor_stepper(trainer, batches)
                notes[floor] = "the packed step's GEMMs with its shapes, random data"
        measured = measure_interleaved(steppers, warmup=args.warmup, updates=args.updates)
    rows = [
        (name, rate, padding, notes.get(name, "")) for name, (rate, padding) in measured.items()
    ]
    for name, rate, _, _ in rows:
        print(f"  {name}: {rate:,.0f} tok/s", flush=True)
    if args.skip_compile:
        return rows
    for label, layout, batching in configs:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = make_trainer(tmp, "--layout", layout, "--compile", "--length-multiple", "16")
            if batching == "random":
                batches = random_batches(trainer, seed=1)[:count]
            else:
                batches = trainer.plan.current.rank_batches.to_list()[:count]
            note = f"warm-up {compile_for(trainer, batches):.0f} s for {len(trainer.compiled.shapes)} shapes"
            rate, padding = measure(trainer, batches, warmup=args.warmup, updates=args.updates)
            rows.append((label + " + compile", rate, padding, note))
            print(f"  {label} + compile: {rate:,.0f} tok/s", flush=True)
            trainer.close()
        torch.compiler.set_stance("default")
        torch.compiler.reset()
    return rows


# Runs a source tree's cli/train.py with that tree first on sys.path, so an older checkout (a git
# worktree of the commit before a change) is measured in the same run as this one.
# Its cli/ directory is made the nmt_cli package (as the installed one is), so the tree's own
# command-line code runs with its own library.
LAUNCH = (
    "import importlib.util, runpy, sys; tree = sys.argv[1]; sys.path.insert(0, tree); "
    "spec = importlib.util.spec_from_file_location('nmt_cli', tree + '/cli/__init__.py', "
    "submodule_search_locations=[tree + '/cli']); cli = importlib.util.module_from_spec(spec); "
    "sys.modules['nmt_cli'] = cli; spec.loader.exec_module(cli); "
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


def plain_process_tokens_per_second(args: argparse.Namespace) -> float:
    """The plain PyTorch loop in a process of its own (2 threads), as nmt-train runs."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--plain-child",
        "--updates",
        str(args.updates),
        "--warmup",
        str(args.warmup),
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"}
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return float(json.loads(result.stdout.strip().splitlines()[-1])["tokens_per_second"])


def plain_child(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(tmp, "--layout", "padded")
        batches = random_batches(trainer, seed=1)[: args.warmup + args.updates]
        stepper = plain_loop_stepper(trainer, batches)
        rate, _ = measure_interleaved({"plain": stepper}, warmup=args.warmup, updates=args.updates)[
            "plain"
        ]
        trainer.close()
    print(json.dumps({"tokens_per_second": rate}))


def process_rows(args: argparse.Namespace) -> list[tuple[str, float, float, str]]:
    """Processes taking turns, --repeats rounds (medians): the plain loop, then nmt-train 1 x 2
    threads and 2 x 1 (torchrun); with --baseline-tree, that tree's nmt-train runs beside this
    one's, and the ratio is printed."""
    trees = [("", ROOT)] + ([(" [baseline]", args.baseline_tree)] if args.baseline_tree else [])
    runs: dict[str, list[float]] = {}
    plain = "plain PyTorch loop, a process (2 threads)"
    for _ in range(args.repeats):
        runs.setdefault(plain, []).append(plain_process_tokens_per_second(args))
        for procs in (1, 2):
            name = f"{procs} process{'es' if procs > 1 else ''} x {2 // procs} thread{'s' if procs == 1 else ''} (nmt-train)"
            for label, tree in trees:
                runs.setdefault(name + label, []).append(
                    nmt_train_tokens_per_second(tree, procs, args)
                )
    rows = []
    for name, rates in runs.items():
        note = "runs: " + ", ".join(f"{r:,.0f}" for r in rates)
        if name != plain:
            note = f"{args.process_layout} + our sampler; " + note
        rows.append((name, float(np.median(rates)), float("nan"), note))
        print(f"  {name}: {rows[-1][1]:,.0f} tok/s", flush=True)
    if args.baseline_tree:
        for procs in (1, 2):
            mine = [
                r for n, r, _, _ in rows if n.startswith(f"{procs} process") and "baseline" not in n
            ]
            theirs = [
                r for n, r, _, _ in rows if n.startswith(f"{procs} process") and "baseline" in n
            ]
            ratio = mine[0] / theirs[0]
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
    parser.add_argument("--results", help="also write the tables as a results file (nmt.results)")
    parser.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ensure_data()
    if args.plain_child:
        plain_child(args)
        return
    print("measuring ...", flush=True)
    sections = [("in one process, the update step only, rows taking turns", in_process_rows(args))]
    if not args.skip_processes:
        sections.append(
            ("whole processes taking turns (nmt-train from start to exit)", process_rows(args))
        )
    print(
        f"\nMulti30k en-de, 3+3 x 256 (FFN 1024), --max-tokens 4096, fp32, {args.updates} timed updates each"
    )
    published = []
    for title, rows in sections:
        plain = rows[0][1]  # each section starts with the plain loop measured its way
        print(f"\n{title}")
        print(f"{'configuration':<46} {'tgt tok/s':>10} {'vs plain':>9} {'padding':>8}  note")
        for name, tokens_per_s, padding, note in rows:
            pad = "" if np.isnan(padding) else f"{padding:.1%}"
            if np.isnan(tokens_per_s):
                print(f"{name:<46} {'-':>10} {'-':>9} {pad:>8}  {note}")
                published.append([title, name, "-", "-", pad, note])
                continue
            print(
                f"{name:<46} {tokens_per_s:>10,.0f} {tokens_per_s / plain:>8.2f}x {pad:>8}  {note}"
            )
            published.append(
                [title, name, f"{tokens_per_s:,.0f}", f"{tokens_per_s / plain:.2f}x", pad, note]
            )
    print("vs plain: against the plain PyTorch loop measured in this run\n")
    if args.results:
        rates = {f"{title}: {name}": rate for title, rows in sections for name, rate, _, _ in rows}
        write_results(
            args.results,
            figures={
                "tokens_per_second": {k: v for k, v in rates.items() if not np.isnan(v)},
                "table": {
                    "columns": [
                        "section",
                        "configuration",
                        "tgt tok/s",
                        "vs plain",
                        "padding",
                        "note",
                    ],
                    "rows": published,
                },
            },
        )


if __name__ == "__main__":
    main()

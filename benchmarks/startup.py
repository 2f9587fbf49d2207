"""Training start-up at scale: a 10M-pair dataset to update 10, and the data plan's pieces at 10M/100M.

    python benchmarks/startup.py [--data /tmp/nmt-bench/data-given] [--samples 10M,100M] [--skip-train]

1. `nmt-train DATA --max-update 10` as a subprocess (transformer_tiny, --max-tokens 4096, packed),
   timed from the process start to its first and tenth update (the JSON records' wall clock), with
   the peak summed PSS of the process tree. DATA defaults to the 10M-pair dataset that
   `benchmarks/preprocess.py --pairs 10M --steps given` leaves in its workdir (built when missing).
2. The plan's pieces on synthetic lengths of N samples (Multi30k-like: 2-60 tokens), each in a fresh
   process for its peak RSS: one epoch's global batches (length noise), the rank's share (8 ranks,
   balanced), a two-corpus blend index, a length curriculum (difficulty bins), square-root
   competence. The lengths are what training reads: never the tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from preprocess import parse_count, run_measured  # noqa: E402  (the sibling benchmark's process-tree sampler)

from nmt.results import write_results  # noqa: E402

PIECE = r"""
import resource, sys, time
import numpy as np
from nmt.config import BatchingConfig
from nmt.data.batching import global_batches, shard
from nmt.data.blend import build_blend_index
num, piece = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(0)
src = rng.integers(2, 61, num).astype(np.int32)
tgt = np.clip(src + rng.integers(-3, 4, num), 2, 60).astype(np.int32)
started = time.perf_counter()
if piece == "batches":
    global_batches(src, tgt, BatchingConfig(max_tokens=4096), seed=1, epoch=0)
elif piece == "shard":
    batches = global_batches(src, tgt, BatchingConfig(max_tokens=4096), seed=1, epoch=0)
    started = time.perf_counter()
    for rank in range(8):
        shard(batches, num_replicas=8, rank=rank, sample_tokens=src.astype(np.int64) + tgt)
elif piece == "blend":
    build_blend_index([num // 4, num - num // 4], [0.5, 0.5], num, seed=1, epoch=0)
elif piece == "curriculum":
    difficulty = np.maximum(src, tgt).astype(np.float64)
    global_batches(src, tgt, BatchingConfig(max_tokens=4096, curriculum_epochs=1), seed=1, epoch=0, difficulty=difficulty)
elif piece == "competence":
    difficulty = np.maximum(src, tgt).astype(np.float64)
    cfg = BatchingConfig(max_tokens=4096, competence_updates=5000)
    global_batches(src, tgt, cfg, seed=1, epoch=0, difficulty=difficulty, batches_per_update=8)
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)
"""
PIECES = ("batches", "shard", "blend", "curriculum", "competence")


def ensure_dataset(path: str, workdir: str) -> None:
    if os.path.isfile(os.path.join(path, "manifest.json")):
        return
    print(
        f"building {path} with benchmarks/preprocess.py (10M pairs: several minutes) ...",
        flush=True,
    )
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "preprocess.py"),
            "--pairs",
            "10M",
            "--steps",
            "given",
            "--workdir",
            workdir,
        ],
        check=True,
    )


def train_rows(data: str) -> list[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory() as save_dir:
        command = [
            sys.executable,
            "-m",
            "nmt_cli.train",
            data,
            "--save-dir",
            save_dir,
            "--arch",
            "transformer_tiny",
            "--share-all-embeddings",
            "--max-tokens",
            "4096",
            "--layout",
            "packed",
            "--max-update",
            "10",
            "--log-format",
            "json",
            "--log-interval",
            "1",
            "--no-epoch-checkpoints",
            "--no-progress-bar",
        ]
        log = os.path.join(save_dir, "train.jsonl")
        started = time.time()
        seconds, cpu, peak_gb, stderr = run_measured([*command, "--log-file", log])
        records = [json.loads(line) for line in open(log) if line.startswith('{"kind": "train"')]
    found = re.search(r"(\d+) training pairs", stderr)
    num_pairs = f"{int(found.group(1)):,} training pairs" if found else "?"
    first, tenth = records[0]["time"] - started, records[9]["time"] - started
    return [
        ("nmt-train: process start to update 1", f"{first:.1f} s", num_pairs),
        (
            "nmt-train: process start to update 10",
            f"{tenth:.1f} s",
            f"target < 120 s: {'met' if tenth < 120 else 'MISSED'}",
        ),
        (
            "nmt-train: whole run (10 updates, save, exit)",
            f"{seconds:.1f} s ({cpu:.0f} CPU s)",
            f"peak PSS {peak_gb:.2f} GB; target < 3 GB: {'met' if peak_gb < 3 else 'MISSED'}",
        ),
    ]


def piece_rows(sample_counts: list[int]) -> list[tuple[str, str, str]]:
    rows = []
    for num in sample_counts:
        for piece in PIECES:
            result = subprocess.run(
                [sys.executable, "-c", PIECE, str(num), piece],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": ROOT},
            )
            if result.returncode:
                sys.exit(result.stderr[-2000:])
            seconds, peak_gb = map(float, result.stdout.split())
            rows.append(
                (f"{piece} at {num:,} samples", f"{seconds:.2f} s", f"peak RSS {peak_gb:.2f} GB")
            )
            print(f"  {rows[-1]}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="/tmp/nmt-bench/data-given")
    parser.add_argument("--samples", default="10M,100M", help="sample counts for the plan's pieces")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--results", help="also write the table as a results file (nmt.results)")
    args = parser.parse_args()
    rows = []
    if not args.skip_train:
        ensure_dataset(args.data, os.path.dirname(os.path.abspath(args.data)))
        rows += train_rows(args.data)
    rows += piece_rows([parse_count(n) for n in args.samples.split(",")])
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores")
    print(f"{'what':<52} {'time':>22}  note")
    for what, seconds, note in rows:
        print(f"{what:<52} {seconds:>22}  {note}")
    if args.results:
        table = {"columns": ["what", "time", "note"], "rows": [list(row) for row in rows]}
        write_results(args.results, figures={"table": table})


if __name__ == "__main__":
    main()

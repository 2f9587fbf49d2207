"""The blended index (1,000 corpora) built by nmt.data.blend next to the simplest correct version,
in one run, side by side: wall and CPU seconds, peak memory, and the ratios.

- ours:        nmt.data.blend.build_blend_index (largest-remainder counts, affine passes, blocks
               permuted by a keyed bijection, threads)
- rank-half:   what one of 2 ranks builds (its half of the blocks, then saved as a part file)
- simple:      np.repeat of the same per-corpus counts; each whole pass over a corpus a fresh
               rng.permutation, the last partial one rng.choice without replacement; then one
               permutation of the whole epoch applied to both arrays in place (Fisher-Yates twice
               from the same generator state: the output is the only memory of size N). The same
               counts and passes as ours; every rank builds the whole index.

Each case runs in a fresh subprocess, so its peak RSS (ru_maxrss) and first-touch page faults are
its own; "CPU s" counts all threads.

    .venv/bin/python benchmarks/blend.py                        # 10M, 100M, 1B (~7 GB free)
    .venv/bin/python benchmarks/blend.py --samples 10M,100M     # skip the 1B case

The greedy O(N k) allocation loop of the first version is timed at --reference-samples and
extrapolated (the README's reference row).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from nmt.data import blend
from nmt.data.blend import (
    allocate_samples,
    build_blend_index,
    make_plan,
    normalize_weights,
    weights_from_temperature,
)
from nmt.results import write_results

MODES = ("ours", "rank-half", "simple")
COLUMNS = ["samples", "case", "wall s", "CPU s", "peak GB", "wall / ours", "CPU / ours"]


def corpora(num_corpora: int) -> tuple[np.ndarray, np.ndarray]:
    """Log-uniform sizes 1e4..1e7 (~1.4B sentences in all), temperature-5 weights: small corpora
    are repeated and large ones subsampled, as in a real multilingual mix."""
    rng = np.random.default_rng(0)
    sizes = np.round(10 ** rng.uniform(4, 7, num_corpora)).astype(np.int64)
    return sizes, weights_from_temperature(sizes, 5.0)


def parse_count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def simple_blend_index(
    sizes: np.ndarray, weights: np.ndarray, num_samples: int, *, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray]:
    counts = allocate_samples(normalize_weights(weights, num_corpora=sizes.shape[0]), num_samples)
    rng = np.random.default_rng([seed, epoch])
    corpus_ids = np.repeat(np.arange(sizes.shape[0], dtype=np.uint16), counts)
    sample_ids = np.empty(num_samples, dtype=np.int32)
    start = 0
    for size, count in zip(sizes.tolist(), counts.tolist()):
        for _ in range(count // size):  # whole passes, each in an order of its own
            sample_ids[start : start + size] = rng.permutation(size)
            start += size
        rest = count % size  # then a subset without replacement
        sample_ids[start : start + rest] = rng.choice(size, rest, replace=False)
        start += rest
    state = rng.bit_generator.state
    rng.shuffle(corpus_ids)
    rng.bit_generator.state = state  # the same swaps: one permutation of both arrays
    rng.shuffle(sample_ids)
    return corpus_ids, sample_ids


def child(mode: str, num_samples: int, num_corpora: int) -> None:
    sizes, weights = corpora(num_corpora)
    start, start_cpu = time.perf_counter(), time.process_time()
    if mode == "simple":
        corpus_ids, _ = simple_blend_index(sizes, weights, num_samples, seed=0, epoch=0)
    elif mode == "rank-half":
        plan = make_plan(sizes, weights, num_samples, seed=0, epoch=0)
        corpus_ids, _ = blend._build_rank_part(plan, rank=0, world_size=2, num_threads=None)
    else:
        corpus_ids, _ = build_blend_index(sizes, weights, num_samples, seed=0, epoch=0)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # (the counts and passes of both are checked by tests/data/test_blend.py's invariants)
    print(json.dumps({"seconds": seconds, "cpu": cpu_seconds, "peak": peak, "n": len(corpus_ids)}))


def greedy_reference(weights: np.ndarray, num_samples: int) -> np.ndarray:
    """The O(N k) loop: each sample to the corpus furthest below its target (first max wins)."""
    targets = weights * num_samples
    counts = np.zeros(weights.shape[0], dtype=np.int64)
    for step in range(num_samples):
        counts[np.argmax(targets - counts)] += 1
        if step % 50_000 == 0:
            print(f"  greedy reference: {step:,}/{num_samples:,}", file=sys.stderr, flush=True)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", default="10M,100M,1B")
    parser.add_argument("--corpora", type=int, default=1000)
    parser.add_argument("--modes", default=",".join(MODES), help=f"any of {', '.join(MODES)}")
    parser.add_argument("--reference-samples", default="200K", help="0: skip the greedy loop")
    parser.add_argument("--results", help="also write the table as a results file (nmt.results)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-samples", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.child_samples, args.corpora)
        return

    sizes, _ = corpora(args.corpora)
    print(
        f"{args.corpora} corpora, sizes 1e4..1e7 (sum {sizes.sum():,}), temperature-5 weights; "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start"
    )
    print(
        f"{'samples':>14}  {'case':<20} {'wall s':>8} {'CPU s':>8} {'peak GB':>8} "
        f"{'wall / ours':>12} {'CPU / ours':>11}"
    )
    modes = args.modes.split(",")
    rows = []
    for num_samples in map(parse_count, args.samples.split(",")):
        ours = None
        for mode in modes:
            print(f"  {mode} at {num_samples:,} ...", file=sys.stderr, flush=True)
            command = [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--child-samples",
                str(num_samples),
            ]
            command += ["--corpora", str(args.corpora)]
            result = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
            assert result["n"] == num_samples or mode == "rank-half"
            ours = ours or result
            print(
                f"{num_samples:>14,}  {mode:<20} {result['seconds']:>8.2f} {result['cpu']:>8.2f} "
                f"{result['peak'] / 1e9:>8.2f} {result['seconds'] / ours['seconds']:>11.2f}x "
                f"{result['cpu'] / ours['cpu']:>10.2f}x",
                flush=True,
            )
            rows.append(
                [f"{num_samples:,}", mode, f"{result['seconds']:.2f}", f"{result['cpu']:.2f}"]
                + [f"{result['peak'] / 1e9:.2f}", f"{result['seconds'] / ours['seconds']:.2f}x"]
                + [f"{result['cpu'] / ours['cpu']:.2f}x"]
            )
    figures = {"table": {"columns": COLUMNS, "rows": rows}}
    num_samples = parse_count(args.reference_samples)
    if num_samples:
        figures["greedy"] = time_greedy_reference(args.corpora, num_samples)
    if args.results:
        write_results(args.results, figures=figures)


def time_greedy_reference(num_corpora: int, num_samples: int) -> dict[str, float]:
    """The greedy loop's seconds at ``num_samples`` and its linear extrapolation to 1B (its cost is
    the same per sample whatever the count)."""
    normalized = normalize_weights(corpora(num_corpora)[1], num_corpora=num_corpora)
    start = time.perf_counter()
    reference = greedy_reference(normalized, num_samples)
    seconds = time.perf_counter() - start
    assert np.array_equal(allocate_samples(normalized, num_samples), reference)
    hours_at_1b = seconds * 1e9 / num_samples / 3600
    print(
        f"greedy allocation loop at {num_samples:,} samples: {seconds:.2f} s (the same "
        f"counts as ours), extrapolated to 1B: {hours_at_1b:.1f} h"
    )
    return {"samples": num_samples, "seconds": seconds, "hours_at_1b": hours_at_1b}


if __name__ == "__main__":
    main()

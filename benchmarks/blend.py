"""Time to build the blended index for 1,000 corpora at 100M / 500M / 1B samples, peak memory,
cost per sample (linear growth), and the greedy O(N k) reference loop vs our allocation.

"build s" is a fresh process: it includes faulting in the output's pages, which on our VMs costs
1 to 3 s per GB depending on the host ("first-touch floor"). "build, mapped memory" is the next
epoch built into the same arrays: the index computation alone.

    .venv/bin/python benchmarks/blend.py                      # 100M, 500M, 1B (needs ~8 GB free)
    .venv/bin/python benchmarks/blend.py --samples 100M,500M   # skip the 1B case

Each size runs in a fresh subprocess so that its peak RSS (ru_maxrss) is its own.
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

from nmt.data.blend import (
    allocate_samples,
    build_blend_index,
    fill_blocks,
    make_plan,
    normalize_weights,
    weights_from_temperature,
)


def corpora(num_corpora: int) -> tuple[np.ndarray, np.ndarray]:
    """Log-uniform sizes 1e4..1e7 (~1.4B sentences in all), temperature-5 weights: small corpora
    are repeated and large ones subsampled, as in a real multilingual mix."""
    rng = np.random.default_rng(0)
    sizes = np.round(10 ** rng.uniform(4, 7, num_corpora)).astype(np.int64)
    return sizes, weights_from_temperature(sizes, 5.0)


def parse_count(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "B": 10**9}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def child(num_samples: int, num_corpora: int, num_threads: int | None) -> None:
    sizes, weights = corpora(num_corpora)
    start, start_cpu = time.perf_counter(), time.process_time()
    corpus_ids, sample_ids = build_blend_index(
        sizes, weights, num_samples, seed=0, epoch=0, num_threads=num_threads
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    assert corpus_ids.shape == (num_samples,)
    # The next epoch into the same arrays: the build without first-touch page faults, as for a
    # process whose memory is already mapped.
    start = time.perf_counter()
    plan = make_plan(sizes, weights, num_samples, seed=0, epoch=1)
    fill_blocks(
        plan,
        corpus_ids,
        sample_ids,
        first_block=0,
        last_block=plan.num_blocks,
        num_threads=num_threads or os.cpu_count() or 1,
    )
    mapped_seconds = time.perf_counter() - start
    peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    output_bytes = corpus_ids.nbytes + sample_ids.nbytes
    # The floor under any build: writing the output's bytes into fresh memory. On our VMs first
    # touch is slow and varies with load, so measure it here, after the build (1 GB, scaled).
    start = time.perf_counter()
    np.zeros(2**30, dtype=np.uint8)[::4096] = 1
    touch = (time.perf_counter() - start) * output_bytes / 2**30
    print(
        json.dumps(
            {
                "seconds": seconds,
                "mapped": mapped_seconds,
                "cpu": cpu_seconds,
                "peak": peak_bytes,
                "output": output_bytes,
                "touch": touch,
            }
        )
    )


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
    parser.add_argument("--samples", default="100M,500M,1B")
    parser.add_argument("--corpora", type=int, default=1000)
    parser.add_argument("--reference-samples", default="200K")
    parser.add_argument("--threads", type=int, default=None, help="default: all cores")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.corpora, args.threads)
        return

    sizes, weights = corpora(args.corpora)
    print(f"{args.corpora} corpora, sizes 1e4..1e7 (sum {sizes.sum():,}), temperature-5 weights")
    # CPU seconds (all threads) next to wall time: the machine is shared, so wall time alone
    # mixes our cost with other people's load.
    print(
        f"{'samples':>14} {'build s':>8} {'CPU s':>7} {'ns/sample':>10} {'peak RSS GB':>12} "
        f"{'output GB':>10} {'first-touch floor s':>20} {'build, mapped memory s':>23}"
    )
    per_sample = []
    for num_samples in map(parse_count, args.samples.split(",")):
        print(f"  building {num_samples:,} ...", file=sys.stderr, flush=True)
        command = [sys.executable, __file__, "--child", str(num_samples)]
        command += ["--corpora", str(args.corpora)]
        command += [] if args.threads is None else ["--threads", str(args.threads)]
        result = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
        per_sample.append(
            (
                num_samples,
                result["seconds"] / num_samples * 1e9,
                result["mapped"] / num_samples * 1e9,
            )
        )
        print(
            f"{num_samples:>14,} {result['seconds']:>8.2f} {result['cpu']:>7.2f} "
            f"{per_sample[-1][1]:>10.2f} "
            f"{result['peak'] / 1e9:>12.2f} {result['output'] / 1e9:>10.2f} "
            f"{result['touch']:>20.2f} {result['mapped']:>23.2f}"
        )
    print(
        "linear growth (ns per sample at each N, fresh process / mapped memory; flat = linear): "
        + ", ".join(f"{n / 1e6:g}M: {ns:.2f} / {mapped:.2f}" for n, ns, mapped in per_sample)
    )

    num_samples = parse_count(args.reference_samples)
    normalized = normalize_weights(weights, num_corpora=args.corpora)
    start = time.perf_counter()
    reference = greedy_reference(normalized, num_samples)
    reference_seconds = time.perf_counter() - start
    start = time.perf_counter()
    ours = allocate_samples(normalized, num_samples)
    ours_seconds = time.perf_counter() - start
    assert np.array_equal(ours, reference), "allocation differs from the greedy reference"
    start = time.perf_counter()
    build_blend_index(sizes, weights, num_samples, seed=0, epoch=0, num_threads=args.threads)
    build_seconds = time.perf_counter() - start
    print(
        f"greedy reference vs ours at {num_samples:,} samples x {args.corpora} corpora "
        "(same counts):"
    )
    print(
        f"  reference allocation loop {reference_seconds:.2f} s, our allocation "
        f"{ours_seconds * 1e3:.2f} ms: {reference_seconds / ours_seconds:,.0f}x"
    )
    print(
        f"  reference allocation loop vs our whole index (allocation + samples + order) "
        f"{build_seconds * 1e3:.1f} ms: {reference_seconds / build_seconds:,.0f}x"
    )
    extrapolated = reference_seconds * 1e9 / num_samples
    print(
        f"  reference extrapolated to 1B samples (linear in N at fixed k): "
        f"{extrapolated / 3600:.1f} h"
    )


if __name__ == "__main__":
    main()

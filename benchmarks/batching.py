"""Batching benchmark: padding efficiency, epoch-to-epoch variety, rank balance, speed.

    .venv/bin/python benchmarks/batching.py [--data runs/bench-data] [--samples 10000000]

Prints, on the bundled Multi30k en-de training lengths at --max-tokens (default 4096):
padding efficiency (real tokens / (batch size x longest), each side padded to its own longest)
for random batches, fairseq-style sorted batches (target, then source) and ours in each noise
mode, with the share of batches that differ between two epochs and the number of batches; the
min/max per-rank token load for 2 and 8 simulated ranks; the time to batch one epoch of --samples
synthetic samples; the sample-sort time for --samples keys on 1 vs 2 processes. The data dir is
built with nmt-preprocess when missing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.multiprocessing as mp
from tqdm import tqdm

from nmt.config import BatchingConfig
from nmt.data.batching import (
    Batches,
    batch_tokens,
    global_batches,
    greedy_offsets,
    padding_efficiency,
    shard,
)
from nmt.data.corpus import ParallelCorpus
from nmt.data.sample_sort import distributed_sample_sort
from nmt.results import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_data(data_dir: str) -> None:
    if os.path.exists(os.path.join(data_dir, "manifest.json")):
        return
    preprocess = shutil.which("nmt-preprocess") or os.path.join(
        os.path.dirname(sys.executable), "nmt-preprocess"
    )
    prefix = os.path.join(REPO, "data", "multi30k")
    print(f"building {data_dir} with nmt-preprocess ...", flush=True)
    subprocess.run(
        [
            preprocess,
            "--source-lang",
            "en",
            "--target-lang",
            "de",
            "--trainpref",
            f"{prefix}/train",
            "--validpref",
            f"{prefix}/val",
            "--testpref",
            f"{prefix}/test_2016_flickr",
            "--destdir",
            data_dir,
        ],
        check=True,
    )


def batches_in_order(
    order: np.ndarray, src: np.ndarray, tgt: np.ndarray, max_tokens: int
) -> Batches:
    """Greedy token-budget batches over a given sample order (for the baselines)."""
    offsets = greedy_offsets(src[order], tgt[order], max_tokens, packed=False)
    return Batches(order, offsets[:-1], offsets[1:])


def share_changed(first: Batches, second: Batches) -> float:
    other = {frozenset(b.tolist()) for b in second.to_list()}
    return sum(frozenset(b.tolist()) not in other for b in first.to_list()) / max(len(first), 1)


def padding_table(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[list[str]]:
    def ours(**changes: object) -> Callable[[int], Batches]:
        cfg = BatchingConfig(max_tokens=max_tokens, **changes)
        return lambda epoch: global_batches(src, tgt, cfg, seed=1, epoch=epoch)

    def random_batches(epoch: int) -> Batches:
        return batches_in_order(
            np.random.default_rng([0, epoch]).permutation(src.shape[0]), src, tgt, max_tokens
        )

    def fairseq(epoch: int) -> Batches:
        # fairseq's ordered_indices: a random permutation, then stable sorts; target is the
        # primary key and source the secondary, as in the reference figure.
        shuffled = np.random.default_rng([0, epoch]).permutation(src.shape[0])
        order = shuffled[np.argsort(src[shuffled], kind="stable")]
        order = order[np.argsort(tgt[order], kind="stable")]
        return batches_in_order(order, src, tgt, max_tokens)

    methods = {
        "random batches": random_batches,
        "fairseq sort (target, source)": fairseq,
        "ours, length noise 0.1": ours(noise_mode="length", batch_noise=0.1),
        "ours, length noise 0.2": ours(noise_mode="length", batch_noise=0.2),
        "ours, sorted (longest, tgt, src), noise 0": ours(batch_noise=0.0),
        "ours, ties (default)": ours(),
    }
    print(f"\n== Multi30k train ({src.shape[0]} pairs), max_tokens {max_tokens} ==")
    print(
        f"{'method':44s} {'padding eff.':>12s} {'vs fairseq':>10s} {'batches':>8s} {'changed e0->e1':>16s}"
    )
    rows = {}
    for name, make in methods.items():
        first, second = make(0), make(1)
        rows[name] = (
            padding_efficiency(first, src, tgt),
            len(first),
            share_changed(first, second),
            first,
        )
    reference = rows["fairseq sort (target, source)"][0]
    published = []
    for name, (efficiency, num_batches, changed, _first) in rows.items():
        changed_count = round(changed * num_batches)
        print(
            f"{name:44s} {efficiency:12.3f} {efficiency / reference:9.3f}x {num_batches:8d} "
            f"{changed:7.1%} ({changed_count}/{num_batches})"
        )
        published.append(
            [name, f"{efficiency:.3f}", f"{efficiency / reference:.3f}x", f"{num_batches:,}"]
            + [f"{changed:.1%} ({changed_count}/{num_batches})"]
        )

    default = rows["ours, ties (default)"][3]
    print("\n== per-rank token load (real source + target tokens), default mode ==")
    tokens = src + tgt
    for world in (2, 8):
        for name, sample_tokens in (
            ("interleaved r, r+W, ...", None),
            ("balanced per step (sampler)", tokens),
        ):
            loads = [
                int(
                    batch_tokens(
                        shard(default, num_replicas=world, rank=r, sample_tokens=sample_tokens),
                        tokens,
                    ).sum()
                )
                for r in range(world)
            ]
            low, high = min(loads), max(loads)
            print(
                f"{world} ranks, {name:28s}: min {low:7d}  max {high:7d}  max/min {high / low:.4f}  "
                f"(target within 2%: {'met' if high / low <= 1.02 else 'MISSED'})"
            )
    return published


def synthetic_lengths(num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = np.clip(rng.lognormal(2.6, 0.5, num_samples), 1, 200).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.1, 0.2, num_samples), 1, 250).astype(np.int64)
    return src, tgt


def speed_table(num_samples: int, max_tokens: int) -> None:
    src, tgt = synthetic_lengths(num_samples)
    print(
        f"\n== one epoch of batches for {num_samples:,} synthetic samples, max_tokens {max_tokens} =="
    )
    for mode in tqdm(["ties", "length"], desc="batching", leave=False):
        cfg = BatchingConfig(max_tokens=max_tokens, noise_mode=mode)
        start = time.perf_counter()
        batches = global_batches(src, tgt, cfg, seed=1, epoch=0)
        seconds = time.perf_counter() - start
        tqdm.write(
            f"noise_mode={mode:6s}: {seconds:6.2f} s  ({len(batches):,} batches; target < 10 s: "
            f"{'met' if seconds < 10 else 'MISSED'})"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sort_worker(rank: int, world_size: int, port: int, num_keys: int, results: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(minutes=5)
    )
    rng = np.random.default_rng(rank)
    shard_size = num_keys // world_size
    index = np.arange(rank * shard_size, (rank + 1) * shard_size, dtype=np.float64)
    keys = np.stack([rng.integers(0, 200, shard_size).astype(np.float64), index], axis=1)
    torch.distributed.barrier()
    start = time.perf_counter()
    out = distributed_sample_sort(keys)
    torch.distributed.barrier()
    results.put((rank, time.perf_counter() - start, out.shape[0]))  # type: ignore[attr-defined]
    torch.distributed.destroy_process_group()


def sample_sort_table(num_keys: int) -> None:
    print(f"\n== sample sort of {num_keys:,} (difficulty, index) keys ==")
    times = {}
    for world_size in tqdm([1, 2], desc="sample sort", leave=False):
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        port = _free_port()
        processes = [
            ctx.Process(target=_sort_worker, args=(r, world_size, port, num_keys, results))
            for r in range(world_size)
        ]
        for p in processes:
            p.start()
        got = [results.get(timeout=600) for _ in processes]
        for p in processes:
            p.join()
        times[world_size] = max(seconds for _, seconds, _ in got)
        sizes = [size for _, _, size in sorted(got)]
        tqdm.write(f"{world_size} process(es): {times[world_size]:6.2f} s  (slice sizes {sizes})")
    print(
        f"speed-up 2 vs 1: {times[1] / times[2]:.2f}x (both processes share this machine's cores)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=os.path.join(REPO, "runs", "bench-data"))
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument(
        "--results", help="also write the padding table as a results file (nmt.results)"
    )
    args = parser.parse_args()
    ensure_data(args.data)
    corpus = ParallelCorpus(args.data, "train")
    src = np.asarray(corpus.src_lengths, dtype=np.int64)
    tgt = np.asarray(corpus.tgt_lengths, dtype=np.int64)
    padding = padding_table(src, tgt, args.max_tokens)
    if args.results:
        columns = ["method", "padding eff.", "vs fairseq sort", "batches", "changed epoch 0 -> 1"]
        write_results(args.results, figures={"table": {"columns": columns, "rows": padding}})
    speed_table(args.samples, args.max_tokens)
    sample_sort_table(args.samples)


if __name__ == "__main__":
    main()

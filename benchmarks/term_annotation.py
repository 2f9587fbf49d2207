"""--term-annotation-rate: what the length upper bound costs in batches, and the annotation's time.

    .venv/bin/python benchmarks/term_annotation.py [--data runs/bench-data-terms] [--rate 0.5]

On the bundled Multi30k en-de training set (built with today's nmt-preprocess when missing, so that
its vocabulary has <term>), for one epoch at --max-tokens: the share of sources annotated, the
tokens an annotation adds (drawn) against the room batching counts for it (the upper bound, read
from lengths only), the batches per epoch without and with annotation, and the time to read every
sample plain and annotated. Figures side by side with ratios; the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from nmt.config import BatchingConfig
from nmt.data.batching import global_batches
from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import load_manifest
from nmt.data.terminology import TermAnnotation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batching import REPO, ensure_data  # noqa: E402  (the same Multi30k preprocessing)


def num_batches(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> int:
    cfg = BatchingConfig(max_tokens=max_tokens, layout="padded")
    return len(global_batches(src, tgt, cfg, seed=1, epoch=0))


def read_all(dataset) -> tuple[np.ndarray, float]:
    """Every sample's source length, and the seconds it took to read them all."""
    started = time.perf_counter()
    lengths = np.fromiter((len(dataset[i][0]) for i in range(len(dataset))), dtype=np.int64)
    return lengths, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.path.join(REPO, "runs", "bench-data-terms"))
    parser.add_argument("--rate", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=4096)
    args = parser.parse_args()
    ensure_data(args.data)
    manifest = load_manifest(args.data)
    corpus = ParallelCorpus(args.data, "train", manifest=manifest)
    annotated = TermAnnotation.for_dataset(manifest, args.rate).corpus(corpus, seed=1, epoch=0)
    plain_src, plain_time = read_all(corpus)
    actual_src, annotated_time = read_all(annotated)
    chosen = annotated.room > 0
    added = actual_src - plain_src
    tgt = np.asarray(corpus.tgt_lengths, dtype=np.int64)
    batches_plain = num_batches(plain_src, tgt, args.max_tokens)
    batches_bound = num_batches(np.asarray(annotated.src_lengths), tgt, args.max_tokens)
    batches_exact = num_batches(actual_src, tgt, args.max_tokens)
    print(
        f"Multi30k en-de train: {len(corpus)} samples, --term-annotation-rate {args.rate}, "
        f"--max-tokens {args.max_tokens}"
    )
    print(f"annotated sources: {chosen.mean():.1%} (with a phrase: {(added > 0).mean():.1%})")
    print(
        f"tokens added per annotated source: drawn {added[chosen].mean():.2f}, "
        f"counted by batching (bound) {annotated.room[chosen].mean():.2f} "
        f"(x{annotated.room[chosen].mean() / max(added[chosen].mean(), 1e-9):.2f}); "
        f"mean source {plain_src.mean():.2f} tokens"
    )
    print(
        f"batches per epoch: plain {batches_plain}, annotated planned by the bound "
        f"{batches_bound} (x{batches_bound / batches_plain:.3f}), had lengths been exact "
        f"{batches_exact} (x{batches_exact / batches_plain:.3f})"
    )
    print(
        f"reading every sample: plain {plain_time:.2f} s, annotated {annotated_time:.2f} s "
        f"(x{annotated_time / plain_time:.2f}; "
        f"{(annotated_time - plain_time) / max(int(chosen.sum()), 1) * 1e6:.1f} us per annotation)"
    )
    print(f"load average: {' '.join(open('/proc/loadavg').read().split()[:3])}")


if __name__ == "__main__":
    main()

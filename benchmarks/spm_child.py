"""SentencePiece training in a forked child (``nmt.data.spm.train_model``, so that a signal stops it
at once) against the same training in this process, side by side, on the same sample.

    python benchmarks/spm_child.py [--sentences 40000] [--vocab 4000] [--repeats 3]

The sample is synthetic text over 20,000 random words (SentencePiece trains on it for seconds).
Runs alternate between the two ways, so that a change in the machine's load hits both alike; the
models must be byte-identical. Prints the median seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

from nmt.data import spm


def sample(num_sentences: int, *, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(20_000)]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) for _ in range(num_sentences)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=40_000)
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sentences = sample(args.sentences)

    def in_this_process() -> bytes:
        # train_model itself, with its call into a child replaced by a plain call
        saved = spm.run_in_child
        spm.run_in_child = lambda function, what: function()
        try:
            return forked_child()
        finally:
            spm.run_in_child = saved

    def forked_child() -> bytes:
        return spm.train_model(
            sentences,
            vocab_size=args.vocab,
            model_type="unigram",
            character_coverage=1.0,
            num_threads=1,
        )

    ways = {"in this process": in_this_process, "forked child": forked_child}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    models: dict[str, set[bytes]] = {name: set() for name in ways}
    for _ in range(args.repeats):
        for name, train in ways.items():
            started = time.perf_counter()
            models[name].add(train())
            seconds[name].append(time.perf_counter() - started)
    assert len(models["in this process"] | models["forked child"]) == 1, "the models differ"
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[:3]
    print(
        f"{args.sentences} sentences, vocab {args.vocab}, {args.repeats} runs each, "
        f"{os.cpu_count()} CPUs, load {' '.join(load)}"
    )
    base = statistics.median(seconds["in this process"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(
            f"{name:16s} median {median:6.2f} s  (runs: {', '.join(f'{v:.2f}' for v in values)})"
            f"  x{median / base:.3f}"
        )


if __name__ == "__main__":
    main()

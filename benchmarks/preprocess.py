"""nmt-preprocess throughput on the bundled Multi30k en-de, 1 vs 2 workers, side by side.

    python benchmarks/preprocess.py [--repeats 3]

Times the whole job (reading, SentencePiece training, encoding, filtering, writing) and the
encoding stage alone, each the best of --repeats runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time

from nmt.config import PreprocessConfig
from nmt.data.preprocess import preprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI30K = os.path.join(ROOT, "data", "multi30k")
# Measured on this 2-core machine (see issue 2): fairseq-preprocess alone, on text already encoded
# into pieces, 2 workers. A reference figure, not re-run here (fairseq is not a dependency).
FAIRSEQ_PREPROCESS_SECONDS = 11.6


class EncodeTimer(logging.Handler):
    """Picks the encoding figure out of the pipeline's own log line."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = float("nan")

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("encoded "):
            self.seconds = float(record.args[1])


def run_once(workers: int, spm_model: str | None, timer: EncodeTimer) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = PreprocessConfig(
            source_lang="en",
            target_lang="de",
            trainpref=[os.path.join(MULTI30K, "train")],
            validpref=[os.path.join(MULTI30K, "val")],
            testpref=[os.path.join(MULTI30K, "test_2016_flickr")],
            destdir=os.path.join(tmp, "data"),
            workers=workers,
            spm_model=spm_model,
        )
        started = time.perf_counter()
        manifest, _ = preprocess(cfg)
        total = time.perf_counter() - started
        num_sentences = 2 * sum(split.num_lines for split in manifest.splits.values())
    return total, timer.seconds, num_sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    timer = EncodeTimer()
    logging.getLogger("nmt.data.preprocess").addHandler(timer)
    logging.getLogger("nmt.data.preprocess").setLevel(logging.INFO)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")
        preprocess(PreprocessConfig(source_lang="en", target_lang="de", trainpref=[os.path.join(MULTI30K, "train")], destdir=model_dir))
        spm_model = os.path.join(model_dir, "spm.model")
        rows = []
        for workers in (1, 2):
            full = min((run_once(workers, None, timer) for _ in range(args.repeats)), key=lambda r: r[0])
            given = min((run_once(workers, spm_model, timer) for _ in range(args.repeats)), key=lambda r: r[0])
            rows.append((workers, full, given))

    print(f"\nMulti30k en-de, {rows[0][1][2]:,} sentences (both sides, train+valid+test), best of {args.repeats}")
    print(f"{'workers':>7}  {'whole job (spm train)':>22}  {'sent/s':>9}  {'whole job (given spm)':>22}  {'encode only':>11}  {'encode sent/s':>13}")
    for workers, (full_s, _, n), (given_s, encode_s, _) in rows:
        print(f"{workers:>7}  {full_s:>20.2f} s  {n / full_s:>9,.0f}  {given_s:>20.2f} s  {encode_s:>9.3f} s  {n / encode_s:>13,.0f}")
    (_, full1, _), (_, full2, _) = rows
    print(f"2 vs 1 workers, whole job: {full1[0] / full2[0]:.2f}x;  encoding: {rows[0][2][1] / rows[1][2][1]:.2f}x")
    print(
        f"fairseq-preprocess reference (pre-encoded text, 2 workers): {FAIRSEQ_PREPROCESS_SECONDS} s -> "
        f"nmt-preprocess with SentencePiece training is {FAIRSEQ_PREPROCESS_SECONDS / full2[0]:.1f}x faster"
    )


if __name__ == "__main__":
    main()

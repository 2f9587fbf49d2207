"""The Multi30k en-de recipe for one H100/H200: preprocess, train for --minutes, average the last
checkpoints, translate val and test_2016_flickr with beam 5 and score them (not yet run on a GPU:
README.md says why these settings).

    python examples/multi30k-gpu/run.py [--minutes 5] [--out runs/multi30k-gpu] [--data DIR]
        [--average-last 5] [--device cuda] [-- nmt-train flags]

Run from the repository root with nmt installed. Running it again with the same --out resumes, as
examples/multi30k/run.sh does (--stop-time-hours counts the earlier runs' time). The figures go to
OUT/results.json (nmt.results: command, revision, machine, date; updates, minutes, val and test
scores; the hypothesis files OUT/{valid,test}.hyp.de) and one line on stdout.
``benchmarks/gpu.py --smoke`` runs it under its own time limit.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from pathlib import Path

from nmt.recipe import num_updates, positive_minutes, scores, split_references
from nmt.results import write_results

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "data" / "multi30k"

# Reasoned, not tuned (no run, so chosen on neither val nor test): README.md here says why.
MODEL_FLAGS = [
    *("--arch", "transformer_iwslt_de_en", "--share-all-embeddings"),  # 6+6 x 512, FFN 1024
    *("--dropout", "0.3"),
]
MAX_TOKENS = 16384
# val is what settings are chosen on; test is only reported.
SPLITS = ("valid", "test")
# checkpoint_last.pt is written at every epoch's end: 10 passes over the 29,000 pairs per epoch
# make that every ~280 updates, not every ~28 (a 408 MiB write each time, with Adam's state).
EPOCH_FLAGS = ["--epoch-samples", "290000"]
TRAIN_FLAGS = [
    *MODEL_FLAGS,
    "--bf16",
    *("--max-tokens", str(MAX_TOKENS)),
    *("--lr", "1e-3", "--warmup-updates", "500", "--lr-scheduler", "cosine"),
    *EPOCH_FLAGS,
    # Checkpoints for the average; validation loss only, rarely (it costs update time).
    *("--save-interval-updates", "200", "--keep-interval-updates", "5", "--no-epoch-checkpoints"),
    *("--validate-interval", "2", "--log-interval", "100", "--no-progress-bar"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="examples/multi30k-gpu/run.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=positive_minutes, default=5.0, help="training time")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "multi30k-gpu")
    parser.add_argument(
        "--data", type=Path, help="a dataset nmt-preprocess made of Multi30k (default: OUT/data)"
    )
    parser.add_argument("--average-last", type=int, default=5, help="numbered checkpoints averaged")
    parser.add_argument("--device", default="cuda", help="nmt-train's and nmt-eval's --device")
    parser.add_argument("train_flags", nargs="*", help="after --: more nmt-train flags (they win)")
    return parser


def tee(command: list[str]) -> tuple[int, str]:
    """Run a command from the repository root, its output shown as it comes and also returned
    (exit code, output)."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        return process.wait(), "".join(lines)
    finally:
        if process.poll() is None:  # we were stopped (SIGTERM, Ctrl+C): so is the command
            process.terminate()
            process.wait()


def run(command: list[str], *, name: str) -> str:
    """``tee``, and a failure as one line (RuntimeError)."""
    code, output = tee(command)
    if code != 0:
        raise RuntimeError(f"{name} failed (exit {code}); its output is above")
    return output


def preprocess(data: Path, *, corpus: Path = CORPUS, extra: tuple[str, ...] = ()) -> None:
    """The CPU recipe's dataset (joint SentencePiece, 8,000 pieces) of the Multi30k files under
    ``corpus``; the manifest, written last, marks a complete one."""
    if (data / "manifest.json").exists():
        return
    run(
        [
            *(sys.executable, "-m", "nmt_cli.preprocess", "-s", "en", "-t", "de"),
            *("--trainpref", str(corpus / "train"), "--validpref", str(corpus / "val")),
            *("--testpref", str(corpus / "test_2016_flickr"), "--destdir", str(data)),
            *("--overwrite", *extra),
        ],
        name="nmt-preprocess",
    )


def numbered_checkpoints(save_dir: Path) -> int:
    return len(list(save_dir.glob("checkpoint_*_*.pt")))


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl+C, so that nmt-train is stopped too (it saves, then exits).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.average_last < 1:
        parser.error(f"--average-last: must be >= 1, got {args.average_last}")
    data = args.data or args.out / "data"
    if args.data is not None and not (args.data / "manifest.json").exists():
        parser.error(
            f"--data {args.data}: no manifest.json there (not a dataset nmt-preprocess made)"
        )
    save_dir = args.out / "ckpt"
    try:
        preprocess(data)
        log = run(
            [
                *(sys.executable, "-m", "nmt_cli.train", str(data), *TRAIN_FLAGS),
                *("--stop-time-hours", f"{args.minutes / 60:.6f}", "--device", args.device),
                *("--save-dir", str(save_dir), "--log-file", str(args.out / "train.log")),
                *args.train_flags,
            ],
            name="nmt-train",
        )
        # A short run may have fewer numbered checkpoints than the average asks for.
        average = min(args.average_last, numbered_checkpoints(save_dir))
        weights = (
            ["--path", str(save_dir), "--average-last", str(average)]
            if average > 1
            else ["--path", str(save_dir / "checkpoint_last.pt")]
        )
        hypotheses = {split: args.out / f"{split}.hyp.de" for split in SPLITS}
        for split, path in hypotheses.items():
            run(
                [
                    *(sys.executable, "-m", "nmt_cli.eval", str(data), *weights),
                    *("--split", split, "--beam", "5", "--bf16", "--device", args.device),
                    *("--output", str(path)),
                ],
                name="nmt-eval",
            )
        figures = summarise(log, data, hypotheses, save_dir, average=average, minutes=args.minutes)
        results = args.out / "results.json"
        write_results(
            str(results),
            figures=figures,
            hypotheses={split: str(path) for split, path in hypotheses.items()},
            command=[parser.prog, *(sys.argv[1:] if argv is None else argv)],
        )
    except (RuntimeError, ValueError, OSError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    print(
        f"{parser.prog}: val BLEU {figures['valid_bleu']:.2f}; test2016 BLEU {figures['bleu']:.2f} "
        f"chrF2 {figures['chrf']:.2f} after {figures['updates']} updates "
        f"({figures['train_minutes']} min, "
        f"{'last ' + str(average) + ' averaged' if average > 1 else 'checkpoint_last.pt'}); "
        f"{results}"
    )
    return 0


def summarise(
    log: str,
    data: Path,
    hypotheses: dict[str, Path],
    save_dir: Path,
    *,
    average: int,
    minutes: float,
) -> dict[str, object]:
    """The results file's figures: the scores of each split (test unprefixed, as nmt-eval prints
    them, computed from the hypothesis files), the updates reached, the minutes they took."""
    import torch  # noqa: F401  (imported, so that nmt.results records the GPU)

    done = re.search(r"done: .*\((\d+) updates, ([0-9.]+) min\)", log)
    figures: dict[str, object] = {
        "minutes": minutes,
        "updates": num_updates(str(save_dir / "checkpoint_last.pt")),
        "train_minutes": float(done.group(2)) if done else None,
        "average_last": average,
    }
    for split, path in hypotheses.items():
        found = scores(str(path), split_references(str(data), split))
        prefix = "" if split == "test" else f"{split}_"
        figures.update({f"{prefix}{metric}": value for metric, value in found.items()})
    return figures


if __name__ == "__main__":
    sys.exit(main())

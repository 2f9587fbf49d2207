"""The Multi30k en-de recipe for one H100/H200: preprocess, train for --minutes, average the last
checkpoints, translate test_2016_flickr with beam 5 and score it (UNMEASURED: README.md says why
these settings, and what they are expected to give).

    python examples/multi30k-gpu/run.py [--minutes 5] [--out runs/multi30k-gpu] [--data DIR]
        [--average-last 5] [--device cuda] [-- nmt-train flags]

Run from the repository root with nmt installed. Running it again with the same --out resumes, as
examples/multi30k/run.sh does (--stop-time-hours counts the earlier runs' time). The figures go to
OUT/results.json (command, revision, machine, date, updates, minutes, scores) and one line on
stdout. ``benchmarks/gpu.py --smoke`` runs it under its own time limit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import sys
from pathlib import Path

from nmt.recipe import positive_minutes

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "data" / "multi30k"

# Reasoned from the CPU recipe (examples/multi30k/README.md) and the H200 run (README), not tuned:
# see README.md here.
MODEL_FLAGS = [
    *("--arch", "transformer_iwslt_de_en", "--share-all-embeddings"),  # 6+6 x 512, FFN 1024
    *("--dropout", "0.3"),
]
MAX_TOKENS = 16384
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
        scores = run(
            [
                *(sys.executable, "-m", "nmt_cli.eval", str(data), *weights),
                *("--split", "test", "--beam", "5", "--bf16", "--device", args.device),
                *("--output", str(args.out / "test.hyp.de")),
            ],
            name="nmt-eval",
        )
    except RuntimeError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    results = summarise(log, scores, average=average, minutes=args.minutes, argv=argv)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"{parser.prog}: test2016 BLEU {results['bleu']} chrF2 {results['chrf2']} after "
        f"{results['updates']} updates ({results['train_minutes']} min, "
        f"{'last ' + str(average) + ' averaged' if average > 1 else 'checkpoint_last.pt'}); "
        f"{args.out / 'results.json'}"
    )
    return 0


def summarise(
    log: str, scores: str, *, average: int, minutes: float, argv: list[str] | None
) -> dict[str, object]:
    """The results file's fields: what ran, where, and what it gave."""
    done = re.search(r"done: .*\((\d+) updates, ([0-9.]+) min\)", log)
    bleu = re.search(r"^BLEU = ([0-9.]+)", scores, re.MULTILINE)
    chrf = re.search(r"^chrF2 = ([0-9.]+)", scores, re.MULTILINE)
    revision = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "command": " ".join(["python", "examples/multi30k-gpu/run.py", *(argv or sys.argv[1:])]),
        "revision": revision or None,
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "minutes": minutes,
        "updates": int(done.group(1)) if done else None,
        "train_minutes": float(done.group(2)) if done else None,
        "average_last": average,
        "bleu": float(bleu.group(1)) if bleu else None,
        "chrf2": float(chrf.group(1)) if chrf else None,
    }


def machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return f"{device}, {os.cpu_count()} CPUs, torch {torch.__version__}, {platform.node()}"


if __name__ == "__main__":
    sys.exit(main())

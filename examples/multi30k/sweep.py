"""How the recipe's defaults were chosen: each choice trained for the same wall-clock budget and
scored on **val** (never test), cased detokenized sacreBLEU, beam 5, last checkpoints averaged.

    python examples/multi30k/sweep.py --minutes 8 --out runs/sweep [--only base lr3e-3]

Every choice spells out all its flags, so the table stays true when nmt-train's defaults change.
Prints one markdown row per choice as it finishes (and writes them to OUT/sweep.md): val BLEU,
updates made, and the run's CPU utilisation (the machine is shared; a busy neighbour shows there).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The starting point each choice changes one thing of.
BASE = [
    "--arch",
    "transformer_tiny",
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
    "--share-all-embeddings",
    "--dropout",
    "0.3",
    "--label-smoothing",
    "0.1",
    "--layout",
    "packed",
    "--max-tokens",
    "4096",
    "--lr",
    "2e-3",
    "--warmup-updates",
    "300",
    "--clip-norm",
    "1.0",
]
VOCAB = 8000
CHOICES: dict[str, tuple[str, list[str], int]] = {
    "base": (
        "3+3 layers x 256, FFN 1024, 4096 tokens, lr 2e-3, warm-up 300, dropout 0.3, vocab 8k",
        [],
        VOCAB,
    ),
    "tokens2048": ("--max-tokens 2048 (twice the updates)", ["--max-tokens", "2048"], VOCAB),
    "ffn512": (
        "FFN 512",
        ["--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512"],
        VOCAB,
    ),
    "lr3e-3": ("--lr 3e-3", ["--lr", "3e-3"], VOCAB),
    "dropout0.1": ("--dropout 0.1", ["--dropout", "0.1"], VOCAB),
    "curriculum": (
        "--curriculum length for the first epoch",
        ["--curriculum", "length", "--curriculum-epochs", "1"],
        VOCAB,
    ),
    "vocab6k": ("joint vocabulary of 6,000", [], 6000),
    "padded": ("--layout padded", ["--layout", "padded"], VOCAB),
    "tokens1024": ("--max-tokens 1024", ["--max-tokens", "1024"], VOCAB),
    "tokens2048+dim128": (
        "--max-tokens 2048, embeddings 128, FFN 512",
        [
            "--max-tokens",
            "2048",
            "--encoder-embed-dim",
            "128",
            "--decoder-embed-dim",
            "128",
            "--encoder-ffn-embed-dim",
            "512",
            "--decoder-ffn-embed-dim",
            "512",
        ],
        VOCAB,
    ),
    "dim192": (
        "embeddings 192, FFN 768",
        [
            "--encoder-embed-dim",
            "192",
            "--decoder-embed-dim",
            "192",
            "--encoder-ffn-embed-dim",
            "768",
            "--decoder-ffn-embed-dim",
            "768",
        ],
        VOCAB,
    ),
    "dim128": (
        "embeddings 128, FFN 512",
        [
            "--encoder-embed-dim",
            "128",
            "--decoder-embed-dim",
            "128",
            "--encoder-ffn-embed-dim",
            "512",
            "--decoder-ffn-embed-dim",
            "512",
        ],
        VOCAB,
    ),
    "layers4": ("4+4 layers", ["--encoder-layers", "4", "--decoder-layers", "4"], VOCAB),
}
# The second round starts from the first round's winner (nmt-train's defaults since) and changes one
# thing of it again.
RECIPE = CHOICES["tokens2048+dim128"][1]
CHOICES |= {
    f"recipe+{name}": (f"recipe (tokens2048+dim128) with {description}", [*RECIPE, *flags], vocab)
    for name, (description, flags, vocab) in {
        "lr3e-3": ("--lr 3e-3", ["--lr", "3e-3"], VOCAB),
        "lr5e-3": ("--lr 5e-3", ["--lr", "5e-3"], VOCAB),
        "dropout0.1": ("--dropout 0.1", ["--dropout", "0.1"], VOCAB),
        "dropout0.2": ("--dropout 0.2", ["--dropout", "0.2"], VOCAB),
        "vocab4k": ("a joint vocabulary of 4,000", [], 4000),
        "warmup150": ("--warmup-updates 150", ["--warmup-updates", "150"], VOCAB),
    }.items()
}


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, text=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{(result.stderr or '')[-3000:]}")
    return result


def dataset(out: Path, vocab: int) -> Path:
    destdir = out / f"data{vocab}"
    if not (destdir / "manifest.json").exists():
        run(
            [
                "nmt-preprocess",
                "-s",
                "en",
                "-t",
                "de",
                "--trainpref",
                "data/multi30k/train",
                "--validpref",
                "data/multi30k/val",
                "--destdir",
                str(destdir),
                "--spm-vocab-size",
                str(vocab),
                "--overwrite",
            ],
            capture_output=True,
        )
    return destdir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="training budget of each choice")
    parser.add_argument("--out", default="runs/sweep")
    parser.add_argument("--only", nargs="+", choices=sorted(CHOICES), help="these choices only")
    parser.add_argument(
        "--average-last",
        type=int,
        default=3,
        help="numbered checkpoints (every 50 updates) averaged",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    header = f"| choice ({args.minutes:g} min each) | val BLEU | updates | CPU utilisation |\n| --- | --- | --- | --- |"
    print(header, flush=True)
    rows = [header]
    for name in args.only or CHOICES:
        description, flags, vocab = CHOICES[name]
        data, save_dir = dataset(out, vocab), out / name
        cpu_before, wall_before = os.times(), time.perf_counter()
        run(
            [
                "nmt-train",
                str(data),
                *BASE,
                *flags,
                "--stop-time-hours",
                str(args.minutes / 60),
                "--save-dir",
                str(save_dir),
                "--save-interval-updates",
                "50",
                "--keep-interval-updates",
                str(args.average_last),
                "--no-epoch-checkpoints",
                "--no-progress-bar",
                "--log-file",
                str(save_dir / "train.log"),
            ],
            capture_output=True,
        )
        cpu_after, wall = os.times(), time.perf_counter() - wall_before
        cpu = (
            cpu_after.children_user
            + cpu_after.children_system
            - cpu_before.children_user
            - cpu_before.children_system
        )
        updates = re.findall(
            r"\((\d+) updates, [\d.]+ min\)", (save_dir / "train.log").read_text()
        )[-1]
        scored = run(
            [
                "nmt-eval",
                str(data),
                "--path",
                str(save_dir),
                "--average-last",
                str(args.average_last),
                "--split",
                "valid",
                "--beam",
                "5",
                "--output",
                str(save_dir / "valid.hyp"),
            ],
            capture_output=True,
        )
        bleu = re.search(r"^BLEU = ([\d.]+)", scored.stdout, flags=re.M)
        assert bleu is not None, scored.stdout
        row = f"| {name}: {description} | {bleu.group(1)} | {updates} | {cpu / (wall * os.cpu_count()):.0%} |"
        print(row, flush=True)
        rows.append(row)
        (out / "sweep.md").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()

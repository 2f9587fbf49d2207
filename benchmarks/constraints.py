"""Lexically constrained beam search against the plain beam, on one checkpoint and dataset split.

    python benchmarks/constraints.py [--path runs/ckpt/checkpoint_best.pt] [--data runs/data]
        [--split test] [--beam 5] [--seed 1] [--repeats 1] [--threads N] [--device cpu]

Constraints are drawn from the references as the papers draw them (Post & Vilar 2018, Hu et al.
2019): per sentence, 1-2 random reference phrases of 1-3 words (fixed --seed) that the
unconstrained beam's output misses; a sentence whose reference has no such phrase gets none.
Printed side by side: sentences/s (decoding only; the two searches alternate --repeats times and
each one's best time is used), the ratio constrained / plain, term success (% of constraint
phrases found in the output text, and % of sentences with all of theirs), BLEU and chrF2.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmt.eval.translate import Translator, load_split, read_references


def draw_constraints(
    references: Sequence[str], outputs: Sequence[str], *, seed: int
) -> list[list[str]]:
    """Per sentence, 1-2 reference phrases (1-3 words) not in its output, distinct and not
    overlapping in the reference."""
    rng = random.Random(seed)
    drawn = []
    for reference, output in zip(references, outputs):
        words, spaced_output = reference.split(), f" {' '.join(output.split())} "
        spans = [
            (start, start + size)
            for size in (1, 2, 3)
            for start in range(len(words) - size + 1)
            if f" {' '.join(words[start : start + size])} " not in spaced_output
        ]
        rng.shuffle(spans)
        wanted = rng.randint(1, 2)
        chosen: list[tuple[int, int]] = []
        for start, stop in spans:
            if len(chosen) == wanted:
                break
            if all(stop <= a or start >= b for a, b in chosen):
                chosen.append((start, stop))
        drawn.append([" ".join(words[a:b]) for a, b in sorted(chosen)])
    return drawn


def term_success(
    outputs: Sequence[str], constraints: Sequence[Sequence[str]]
) -> tuple[float, float]:
    """(% of phrases found in their output, % of constrained sentences with all of theirs)."""
    found = [[phrase in out for phrase in phrases] for out, phrases in zip(outputs, constraints)]
    num_phrases = sum(len(f) for f in found)
    constrained = [f for f in found if f]
    return (
        100.0 * sum(map(sum, found)) / max(num_phrases, 1),
        100.0 * sum(all(f) for f in constrained) / max(len(constrained), 1),
    )


SEARCHES = ("plain", "constrained")
HEADER = (
    f"{'search':<12} {'sent/s':>8} {'ratio':>6} {'terms %':>8} {'all-terms sent %':>17} "
    f"{'BLEU':>6} {'chrF2':>6}"
)


@dataclass
class Comparison:
    """The plain and the constrained beam on one split: outputs, timed runs and the figures."""

    constraints: list[list[str]]
    outputs: dict[str, list[str]]
    times: dict[str, list[float]]
    figures: dict[str, dict[str, float]]  # per search: sent_per_s, ratio, terms, ..., bleu, chrf2

    def lines(self) -> list[str]:
        """The table's rows, one per search."""
        return [
            f"{name:<12} {f['sent_per_s']:>8.1f} {f['ratio']:>6.2f} {f['terms']:>8.1f} "
            f"{f['all_terms_sentences']:>17.1f} {f['bleu']:>6.2f} {f['chrf2']:>6.2f}"
            for name, f in self.figures.items()
        ]


def split_with_references(
    data: str, name: str, translator: Translator
) -> tuple[Sequence[np.ndarray], list[str]]:
    """Split ``name`` of dataset ``data``: its binarized sources and raw references (the script
    exits naming the split when it has no reference text)."""
    split = load_split(data, name, src_spm=translator.src_spm)
    if split.reference_path is None:
        raise SystemExit(f"{data}: split {name} has no reference text")
    references = read_references(
        split.reference_path, num_lines=split.num_lines, line_numbers=split.line_numbers
    )
    return split.sources, references


def compare(
    translator: Translator,
    sources: Sequence[str],
    references: Sequence[str],
    *,
    seed: int,
    repeats: int,
    **options: int,
) -> Comparison:
    """Draw the constraints from the misses of the plain beam (also the warm-up), then time both
    searches, alternating, ``repeats`` times each (the best time counts) and score them."""

    def decode(constraints: list[list[str]] | None) -> tuple[list[str], float]:
        pieces = None if constraints is None else translator.encode_constraints(constraints)
        started = time.perf_counter()
        found = translator.generate(list(sources), constraints=pieces, **options)
        elapsed = time.perf_counter() - started
        return [nbest[0].text for nbest in translator.detokenize(found)], elapsed

    plain, _ = decode(None)
    constraints = draw_constraints(references, plain, seed=seed)
    times: dict[str, list[float]] = {name: [] for name in SEARCHES}
    outputs = {"plain": plain}
    for _ in range(repeats):
        for name in SEARCHES:
            outputs[name], elapsed = decode(None if name == "plain" else constraints)
            times[name].append(elapsed)
    figures = {}
    for name in SEARCHES:
        bleu, chrf = translator.score(outputs[name], references)[:2]
        phrases, sentences = term_success(outputs[name], constraints)
        speed = len(sources) / min(times[name])
        figures[name] = {
            "sent_per_s": speed,
            "ratio": speed / figures["plain"]["sent_per_s"] if figures else 1.0,
            "terms": phrases,
            "all_terms_sentences": sentences,
            "bleu": bleu.score,
            "chrf2": chrf.score,
        }
    return Comparison(constraints, outputs, times, figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="runs/ckpt/checkpoint_best.pt")
    parser.add_argument("--data", default="runs/data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="the constraints' draw")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each search")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    translator = Translator.from_checkpoint(args.path, device=args.device)
    sources, references = split_with_references(args.data, args.split, translator)
    result = compare(
        translator,
        sources,
        references,
        seed=args.seed,
        repeats=args.repeats,
        beam=args.beam,
        batch_size=args.batch_size,
    )
    num = len(sources)
    print(
        f"{args.path} on {args.data} {args.split}: {num} sentences, "
        f"{sum(map(len, result.constraints))} constraint phrases on "
        f"{sum(1 for c in result.constraints if c)} of them (seed {args.seed}); beam {args.beam}, "
        f"batch {args.batch_size}, {args.device}, torch threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs, best of {args.repeats}"
    )
    print(HEADER)
    print("\n".join(result.lines()))
    for score in translator.score(result.outputs["plain"], references)[:2]:
        print(f"  {score.name}: {score.signature}")
    times = {name: np.round(t, 3).tolist() for name, t in result.times.items()}
    print(f"  times (s): plain {times['plain']}, constrained {times['constrained']}")


if __name__ == "__main__":
    main()

"""Terminology on Multi30k (issue 51 part 4): constrained beam against the plain beam, per split.

    python benchmarks/terminology.py --path runs/ckpt/checkpoint_best.pt --data runs/data \
        [--splits valid,test] [--beam 5] [--seed 1] [--repeats 1] [--threads N] \
        [--out-dir runs/terminology] [--results runs/terminology/terminology.json]

Constraints are drawn from each split's references as the papers draw them (benchmarks/constraints.py:
1-2 random reference phrases of 1-3 words per sentence that the plain beam's output misses, fixed
--seed). One table, a row per split and search: sentences/s and its ratio to the plain beam of the
same split in the same run, term success (% of phrases in the output, % of constrained sentences
with all of theirs), BLEU and chrF2. The hypotheses and the constraints (one line per sentence,
phrases tab-separated: nmt-eval --constraints reads them after the source) go to --out-dir; the
figures to a results file (nmt.results: command, revision, machine, date, figures, hypotheses).
"""

from __future__ import annotations

import argparse
import os

import torch
from constraints import HEADER, SEARCHES, compare

from nmt.eval.translate import Translator, load_split, read_references
from nmt.results import write_results


def write_lines(path: str, lines: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(f"{line}\n" for line in lines)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="runs/ckpt/checkpoint_best.pt")
    parser.add_argument("--data", default="runs/data")
    parser.add_argument("--splits", default="valid,test", help="comma-separated dataset splits")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="the constraints' draw")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of each search")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument("--out-dir", default="runs/terminology", help="hypotheses, constraints")
    parser.add_argument("--results", help="results file (default: OUT_DIR/terminology.json)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)

    translator = Translator.from_checkpoint(args.path, device=args.device)
    figures: dict[str, object] = {"beam": args.beam, "batch_size": args.batch_size}
    hypotheses: dict[str, str] = {}
    table = []
    for name in args.splits.split(","):
        split = load_split(args.data, name, src_spm=translator.src_spm)
        if split.reference_path is None:
            raise SystemExit(f"{args.data}: split {name} has no reference text")
        references = read_references(
            split.reference_path, num_lines=split.num_lines, line_numbers=split.line_numbers
        )
        result = compare(
            translator,
            split.sources,
            references,
            seed=args.seed,
            repeats=args.repeats,
            beam=args.beam,
            batch_size=args.batch_size,
        )
        figures[name] = {
            "sentences": len(split.sources),
            "constraint_phrases": sum(map(len, result.constraints)),
            "constrained_sentences": sum(1 for c in result.constraints if c),
            "times_s": result.times,
            **result.figures,
        }
        for search in SEARCHES:
            hypotheses[f"{name}.{search}"] = write_lines(
                os.path.join(args.out_dir, f"{name}.{search}.txt"), result.outputs[search]
            )
        hypotheses[f"{name}.constraints"] = write_lines(
            os.path.join(args.out_dir, f"{name}.constraints.tsv"),
            ["\t".join(phrases) for phrases in result.constraints],
        )
        table += [f"{name:<6} {line}" for line in result.lines()]
        print(f"{name}: {figures[name]['constraint_phrases']} phrases", flush=True)

    print(
        f"{args.path} on {args.data}: beam {args.beam}, batch {args.batch_size}, {args.device}, "
        f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs, best of {args.repeats}, constraints seed {args.seed}"
    )
    print(f"{'split':<6} {HEADER}")
    print("\n".join(table))
    results = args.results or os.path.join(args.out_dir, "terminology.json")
    write_results(results, figures=figures, hypotheses=hypotheses)
    print(f"wrote {results}")


if __name__ == "__main__":
    main()

"""The Multi30k en-de recipe: preprocess, train with nmt-train's defaults for a time (or update)
budget, average the last checkpoints, translate test_2016_flickr with beam 5 and score it.

    python examples/multi30k/run.py [--minutes N | --max-update N] [--out DIR] [--average-last K]
        [--corpus DIR] [-- nmt-train flags]

--average-last K: default 5 for budgets of 20 minutes or 3,000 updates and more, else 1 (that is
checkpoint_last.pt alone). Running it again with the same --out resumes: the dataset is kept,
training continues from checkpoint_last.pt (--stop-time-hours counts the time of earlier runs too,
so a longer budget trains on), and a finished run is only evaluated.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from nmt import recipe

PROG = "examples/multi30k/run.py"
ROOT = Path(__file__).resolve().parents[2]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=recipe.positive_minutes, default=10.0)
    budget.add_argument("--max-update", type=int, help="an update budget instead of minutes")
    parser.add_argument("--out", default="runs/multi30k")
    parser.add_argument("--average-last", type=int, help="checkpoints averaged for the test score")
    parser.add_argument("--corpus", default=str(ROOT / "data" / "multi30k"), help="Multi30k's text")
    return parser


def budget_flags(args: argparse.Namespace) -> list[str]:
    if args.max_update is not None:
        return ["--max-update", str(args.max_update)]
    return ["--stop-time-hours", str(args.minutes / 60)]


def steps(args: argparse.Namespace) -> list[recipe.Step]:
    out, corpus = args.out, args.corpus
    data, ckpt = os.path.join(out, "data"), os.path.join(out, "ckpt")
    minutes = 0.0 if args.max_update is not None else args.minutes
    count = recipe.average_last(
        minutes=minutes, max_update=args.max_update or 0, given=args.average_last
    )

    def preprocess() -> None:
        from nmt_cli import preprocess as nmt_preprocess

        recipe.call(
            "nmt-preprocess",
            nmt_preprocess.main,
            [
                *("-s", "en", "-t", "de", "--trainpref", f"{corpus}/train"),
                *("--validpref", f"{corpus}/val", "--testpref", f"{corpus}/test_2016_flickr"),
                *("--destdir", data, "--overwrite"),
            ],
        )

    def train() -> None:
        from nmt_cli import plot as nmt_plot
        from nmt_cli import train as nmt_train

        # nmt-train's defaults are the recipe (README.md here); these flags only checkpoint (every
        # 50 updates, the newest 10 kept, for the average), log, and score val with BLEU every 3rd
        # epoch (greedy) for the curves. The flags after -- come last and win.
        recipe.call(
            "nmt-train",
            nmt_train.main,
            [
                data,
                *budget_flags(args),
                *("--save-dir", ckpt, "--save-interval-updates", "50"),
                *("--keep-interval-updates", "10", "--no-epoch-checkpoints"),
                *("--validate-interval", "3", "--eval-bleu"),
                *("--tensorboard-logdir", os.path.join(out, "tensorboard")),
                *("--log-file", os.path.join(out, "train.log")),
                *args.train_flags,
            ],
        )
        if nmt_plot.main([os.path.join(out, "tensorboard"), "-o", os.path.join(out, "curves.png")]):
            print("nmt-plot failed (pip install -e '.[plot]')", file=sys.stderr)

    def evaluate() -> None:
        from nmt_cli import eval as nmt_eval

        hypotheses = os.path.join(out, "test.hyp.de")
        recipe.call(
            "nmt-eval",
            nmt_eval.main,
            [
                *(data, *recipe.weight_flags(ckpt, count), "--split", "test", "--beam", "5"),
                *("--score-tokenized-lowercase", "--output", hypotheses),
            ],
        )

    return [
        recipe.Step(
            "the dataset", {"corpus": corpus}, [os.path.join(data, "manifest.json")], preprocess
        ),
        # Always run: nmt-train goes on under a longer budget and stops at once under a spent one
        # (another model under -- it refuses itself); the test score is of the model as it is.
        recipe.Step("training", {}, [], train, always=True),
        recipe.Step("the test score", {}, [], evaluate, always=True),
    ]


def main(argv: list[str] | None = None) -> int:
    args = recipe.parse_args(build_parser(), argv)
    started = time.time()

    def run() -> None:
        from nmt.plot import read_curves
        from nmt.results import BY_UPDATE, expected_line, write_results

        recipe.run_steps(args.out, steps(args))
        hypotheses = os.path.join(args.out, "test.hyp.de")
        references = recipe.split_references(os.path.join(args.out, "data"), "test")
        found = recipe.scores(hypotheses, references, tokenized_lowercase=True)
        # The machine may be shared: this job's own CPU seconds over its wall seconds x cores tells.
        times = os.times()
        wall = max(time.time() - started, 1.0)
        cores = os.cpu_count() or 1
        utilisation = (times.user + times.system) / wall / cores
        updates = recipe.num_updates(os.path.join(args.out, "ckpt", "checkpoint_last.pt"))
        results = os.path.join(args.out, "results.json")
        # Greedy val BLEU per update does not depend on the machine's speed, the minutes do.
        curve = read_curves(os.path.join(args.out, "tensorboard")).get("valid BLEU")
        points = zip(curve.updates, curve.values) if curve else []
        by_update = [{"updates": int(u), "valid_bleu": round(float(v), 2)} for u, v in points]
        # The test score joins the curve at the updates reached: a run of the published update
        # budget is then compared with the published test score itself.
        final = {"updates": updates, "bleu": found["bleu"], "chrf": found["chrf"]}
        if by_update and by_update[-1]["updates"] == updates:
            by_update[-1].update(final)
        elif not by_update or by_update[-1]["updates"] < updates:
            by_update.append(final)
        write_results(
            results,
            figures={
                **found,
                "updates": updates,
                "cpu_utilisation": round(utilisation, 3),
                BY_UPDATE: by_update,
            },
            hypotheses={"test2016": hypotheses},
        )
        print(
            f"{PROG}: {int(wall // 60)} min this run, CPU utilisation {utilisation:.0%} of {cores} "
            f"cores; test2016 after {updates} updates: BLEU {found['bleu']:.2f}, chrF2 "
            f"{found['chrf']:.2f} ({results})"
        )
        published = str(ROOT / "results" / "multi30k.json")
        print(f"{PROG}: test2016 BLEU {found['bleu']:.2f}; " + expected_line(published, updates))
        curve_points = [point for point in by_update if "valid_bleu" in point]
        if curve_points:
            last = curve_points[-1]
            print(
                f"{PROG}: greedy val BLEU {last['valid_bleu']:.2f} after {last['updates']} updates; "
                + expected_line(published, last["updates"], "valid_bleu")
            )

    return recipe.run_recipe(PROG, run)


if __name__ == "__main__":
    sys.exit(main())

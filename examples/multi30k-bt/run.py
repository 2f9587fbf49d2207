"""Back-translation on Multi30k en->de: a de->en model back-translates in-domain German captions
(data/multi30k-captions), then en->de trains on real + synthetic pairs; val and test_2016_flickr
scored (variants are chosen on val; test is only reported).

    python examples/multi30k-bt/run.py [--minutes N] [--reverse-minutes M] [--out DIR] [--baseline]
        [--side-by-side] [--bt sample|beam|noise] [--no-tag] [--captions K] [--real-weight W]
        [--reverse-bt MODEL] [--reverse-flags FLAGS] [--forward-translate MODEL] [--filter F] [--ct2]
        [--average-last K] [--corpus DIR] [--captions-dir DIR] [-- NMT_TRAIN_FLAGS]

README.md here describes each step and option. Flags after -- go to nmt-train for both en->de models
(the baseline and the final model, so the comparison stays equal), not to the de->en model. The
model scored last is left at DIR/model.pt; every score in DIR/scores.tsv and DIR/results.json, with
the hypothesis and reference files they were computed from. Steps done before are skipped, so
variants run one after another reuse the de->en model, the back-translation and the baseline; what
each step was made with is in DIR/recipe.json, and a step over one made with other settings
(--minutes, --reverse-minutes, --reverse-flags, flags after --, another --reverse-bt or
--forward-translate model) is refused in one line before anything runs.
"""

from __future__ import annotations

import argparse
import gzip
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt import recipe
from nmt.fileio import atomic_write

PROG = "examples/multi30k-bt/run.py"
ROOT = Path(__file__).resolve().parents[2]
SEARCHES = {
    "sample": ["--sampling", "--topk", "10", "--beam", "1"],
    "beam": ["--beam", "5"],
    "noise": ["--beam", "5", "--source-noise"],
}
# Every model is scored on both: val is what variants are chosen on, test is only reported.
SPLITS = ("valid", "test")
# scores.tsv's columns after name, minutes and updates; test's unprefixed, as before val was scored.
SCORE_NAMES = ("bleu", "chrf", "valid_bleu", "valid_chrf")
TRAIN_FLAGS = [
    *("--no-epoch-checkpoints", "--save-interval-updates", "50", "--keep-interval-updates", "10"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=recipe.positive_minutes, default=5.0)
    parser.add_argument(
        "--reverse-minutes", type=recipe.positive_minutes, help="default: --minutes"
    )
    parser.add_argument("--out", default="runs/multi30k-bt")
    parser.add_argument("--baseline", action="store_true", help="en->de on the real pairs too")
    parser.add_argument(
        "--side-by-side", action="store_true", help="the baseline beside the final model"
    )
    parser.add_argument("--bt", choices=sorted(SEARCHES), default="sample")
    parser.add_argument("--no-tag", action="store_true", help="no <bt> tag on the synthetic source")
    parser.add_argument("--captions", type=int, choices=range(1, 6), default=1, metavar="K")
    parser.add_argument("--real-weight", type=float, default=0.5)
    parser.add_argument("--reverse-bt", help="an en->de checkpoint: iterative back-translation")
    parser.add_argument("--reverse-flags", default="", help="nmt-train flags of the de->en model")
    parser.add_argument("--forward-translate", help="an en->de checkpoint: forward translation")
    parser.add_argument(
        "--filter", type=float, help="keep the best fraction of the synthetic pairs"
    )
    parser.add_argument("--ct2", action="store_true", help="translate with int8 CTranslate2")
    parser.add_argument("--average-last", type=int, help="checkpoints averaged (default by budget)")
    parser.add_argument("--corpus", default=str(ROOT / "data" / "multi30k"), help="Multi30k's text")
    parser.add_argument(
        "--captions-dir", default=str(ROOT / "data" / "multi30k-captions"), help="the captions"
    )
    return parser


def check(args: argparse.Namespace) -> None:
    if args.side_by_side and args.filter is not None:
        raise ValueError(
            "--side-by-side trains the baseline beside the final model, but --filter needs the "
            "baseline first"
        )
    for option, path in (
        ("--reverse-bt", args.reverse_bt),
        ("--forward-translate", args.forward_translate),
    ):
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{option} {path}: no such checkpoint file")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {message}", file=sys.stderr)


def train(minutes: float, data: str, save_dir: str, flags: list[str]) -> None:
    """nmt-train's defaults (the Multi30k recipe) for ``minutes``, checkpoints for the average."""
    from nmt_cli import train as nmt_train

    argv = [
        *(data, "--stop-time-hours", str(minutes / 60), "--save-dir", save_dir),
        *(*TRAIN_FLAGS, "--log-file", f"{save_dir}.log", *flags),
    ]
    recipe.call("nmt-train", nmt_train.main, argv)


def train_one_thread(minutes: float, data: str, save_dir: str, flags: list[str]) -> None:
    """``train`` in a process of its own on one thread (--side-by-side)."""
    import torch

    torch.set_num_threads(1)
    train(minutes, data, save_dir, flags)


class Recipe:
    """The steps of one invocation; the paths and names they share."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = args.out
        self.baseline = args.baseline or args.side_by_side or args.filter is not None
        self.reverse_minutes = args.reverse_minutes or args.minutes
        self.search = SEARCHES[args.bt] + ([] if args.no_tag else ["--tag-source"])
        # --side-by-side starts the trainings of these steps in processes of their own.
        self.train_arguments: dict[str, tuple[float, str, str, list[str]]] = {}

    def path(self, *names: str) -> str:
        return os.path.join(self.out, *names)

    def count(self, minutes: float) -> int:
        return recipe.average_last(minutes=minutes, given=self.args.average_last)

    def dataset(self, name: str, identity: dict[str, Any], run: Callable[[], None]) -> recipe.Step:
        return recipe.Step(f"the dataset {name}", identity, [self.path(name, "manifest.json")], run)

    def preprocess(self, name: str, *options: str) -> recipe.Step:
        from nmt_cli import preprocess as nmt_preprocess

        def run() -> None:
            argv = [*options, "--destdir", self.path(name), "--overwrite"]
            recipe.call("nmt-preprocess", nmt_preprocess.main, argv)

        return self.dataset(name, {"corpus": self.args.corpus}, run)

    def monolingual(self, lang: str, name: str) -> recipe.Step:
        """The first --captions caption files of ``lang`` as a monolingual dataset."""
        from nmt_cli import preprocess as nmt_preprocess

        def run() -> None:
            text = self.path(f"{name}.{lang}")
            os.makedirs(self.out, exist_ok=True)
            with open(text, "wb") as joined:
                for k in range(1, self.args.captions + 1):
                    with gzip.open(
                        os.path.join(self.args.captions_dir, f"train.{k}.{lang}.gz")
                    ) as part:
                        shutil.copyfileobj(part, joined)
            argv = [
                *("--only-source", "-s", lang, "--trainpref", self.path(name)),
                *("--spm-model", self.path("data", "spm.model"), "--dedup"),
                *("--destdir", self.path(name), "--overwrite"),
            ]
            recipe.call("nmt-preprocess", nmt_preprocess.main, argv)
            os.remove(text)

        return self.dataset(name, {"captions": self.args.captions_dir}, run)

    def translate(
        self, source: str, name: str, model: list[str], flags: list[str], identity: dict[str, Any]
    ) -> recipe.Step:
        """``source`` translated by ``model`` into the dataset ``name`` (nmt-eval resumes it)."""
        from nmt_cli import eval as nmt_eval

        def run() -> None:
            log(f"translating {source} into {self.path(name)}")
            argv = [
                *(source, *model, *flags, "--split", "train"),
                *("--output-dataset", self.path(name), "--batch-size", "128"),
            ]
            recipe.call("nmt-eval", nmt_eval.main, argv)

        return self.dataset(name, identity, run)

    def export(self, checkpoints: Callable[[], list[str]], directory: str) -> recipe.Step:
        """The ``checkpoints`` (averaged; known once trained) exported to int8 CTranslate2."""
        from nmt_cli import export as nmt_export

        def run() -> None:
            argv = [",".join(checkpoints()), "--quantization", "int8", "--output-dir", directory]
            recipe.call("nmt-export", nmt_export.main, [*argv, "--force"])

        return recipe.Step(
            f"the export {directory}", {}, [os.path.join(directory, "model.bin")], run
        )

    def en_de_model(self, model: str, steps: list[recipe.Step]) -> tuple[list[str], str]:
        """The --path flags an en->de checkpoint translates with (--ct2: its export, added to
        ``steps``), and its identity."""
        digest = recipe.file_sha256(model)
        if not self.args.ct2:
            return ["--path", model], digest
        directory = self.path(f"en-de-{digest[:16]}-ct2")
        steps.append(self.export(lambda: [model], directory))
        return ["--path", directory], digest

    def training(
        self, name: str, minutes: float, data: str, flags: list[str], identity: dict[str, Any]
    ) -> recipe.Step:
        def run() -> None:
            log(f"training {name} for {minutes:g} min")
            train(minutes, data, self.path(name), flags)

        step = recipe.Step(
            f"the model {name}", identity, [self.path(name, "checkpoint_last.pt")], run
        )
        self.train_arguments[step.name] = (minutes, data, self.path(name), flags)
        return step

    def references(self) -> recipe.Step:
        """Each split's reference text under DIR, so that the results file names it beside the
        hypotheses and its paired-bootstrap p-values can be recomputed from DIR alone."""

        def run() -> None:
            for split, path in self.reference_paths().items():
                lines = recipe.split_references(self.path("data"), split)
                with atomic_write(path, "w", encoding="utf-8", newline="\n") as handle:
                    handle.writelines(line + "\n" for line in lines)

        return recipe.Step("the references", {}, list(self.reference_paths().values()), run)

    def reference_paths(self) -> dict[str, str]:
        return {split: self.path(f"reference.{split}.de") for split in SPLITS}

    def score(self, name: str) -> recipe.Step:
        """val and test_2016_flickr, beam 5, cased sacreBLEU and chrF2 into scores.tsv; the model
        to DIR/model.pt."""
        from nmt_cli import eval as nmt_eval

        count = self.count(self.args.minutes)
        hypotheses = {split: self.path(f"{name}.{split}.de") for split in SPLITS}

        def run() -> None:
            weights = recipe.weight_flags(self.path(name), count)
            found = {}
            for split, path in hypotheses.items():
                argv = [self.path("data"), *weights, "--split", split, "--beam", "5"]
                recipe.call("nmt-eval", nmt_eval.main, [*argv, "--output", path])
                found[split] = recipe.scores(
                    path, recipe.split_references(self.path("data"), split)
                )
            updates = recipe.num_updates(self.path(name, "checkpoint_last.pt"))
            values = {**found["test"], **{f"valid_{k}": v for k, v in found["valid"].items()}}
            row = [name, f"{self.args.minutes:g}", str(updates)]
            row += [f"{values[column]:.2f}" for column in SCORE_NAMES]
            with open(self.path("scores.tsv"), "a", encoding="utf-8") as handle:
                handle.write("\t".join(row) + "\n")
            recipe.save_weights(recipe.weight_paths(self.path(name), count), self.path("model.pt"))
            log(
                f"{name}: val BLEU {found['valid']['bleu']:.2f} chrF2 {found['valid']['chrf']:.2f}, "
                f"test_2016_flickr BLEU {found['test']['bleu']:.2f} chrF2 {found['test']['chrf']:.2f} "
                f"({self.path('model.pt')})"
            )

        outputs = list(hypotheses.values())
        return recipe.Step(f"the score of {name}", {"--average-last": count}, outputs, run)

    def steps(self) -> list[recipe.Step]:
        args = self.args
        corpus = args.corpus
        steps = [
            # en-de with its joint vocabulary; de-en and the captions in the same vocabulary.
            self.preprocess(
                "data",
                *("-s", "en", "-t", "de", "--trainpref", f"{corpus}/train"),
                *("--validpref", f"{corpus}/val", "--testpref", f"{corpus}/test_2016_flickr"),
            ),
            self.preprocess(
                "data-de-en",
                *("-s", "de", "-t", "en", "--trainpref", f"{corpus}/train"),
                *("--validpref", f"{corpus}/val", "--spm-model", self.path("data", "spm.model")),
            ),
        ]
        steps.append(self.references())
        mono = f"mono-{args.captions}"
        steps.append(self.monolingual("de", mono))
        mono_en = f"mono-en-{args.captions}"
        if args.reverse_bt is not None or args.forward_translate is not None:
            steps.append(self.monolingual("en", mono_en))

        name = (
            f"bt-{args.bt}-tagged-c{args.captions}"
            if not args.no_tag
            else f"bt-{args.bt}-c{args.captions}"
        )
        reverse_dir, reverse_flags = "de-en", args.reverse_flags.split()
        reverse_data: list[str] = []
        if args.reverse_bt is not None:
            # The English captions back-translated by an en->de model: the de->en model's data.
            teacher, digest = self.en_de_model(args.reverse_bt, steps)
            steps.append(
                self.translate(
                    self.path(mono_en),
                    f"en-{name}",
                    teacher,
                    self.search,
                    {"--reverse-bt sha256": digest},
                )
            )
            reverse_data = [
                *("--train-subsets", f"train,{self.path(f'en-{name}', 'train')}"),
                *("--subset-weights", "0.5,0.5"),
            ]
            name, reverse_dir = f"{name}-ibt", "de-en-ibt"
        steps.append(
            self.training(
                reverse_dir,
                self.reverse_minutes,
                self.path("data-de-en"),
                [*reverse_data, *reverse_flags],
                {"--reverse-minutes": self.reverse_minutes, "--reverse-flags": reverse_flags},
            )
        )
        reverse_count = self.count(self.reverse_minutes)
        reverse = recipe.weight_flags(self.path(reverse_dir), reverse_count)
        if args.ct2:
            name = f"{name}-ct2"
            export_dir = self.path(f"{reverse_dir}-ct2")
            checkpoints = self.path(reverse_dir)
            steps.append(
                self.export(lambda: recipe.weight_paths(checkpoints, reverse_count), export_dir)
            )
            reverse = ["--path", export_dir]
        steps.append(self.translate(self.path(mono), name, reverse, self.search, {}))

        en_de = {"--minutes": args.minutes, "flags after --": args.train_flags}
        baseline = self.training(
            "baseline", args.minutes, self.path("data"), args.train_flags, en_de
        )
        synthetic, variant = self.path(name), ""
        if args.filter is not None:
            steps.append(baseline)
            synthetic, variant = self.path(f"{name}-f{args.filter:g}"), f"-f{args.filter:g}"
            steps.append(self.filtered(name, synthetic, reverse_dir))
        subsets = ["train", os.path.join(synthetic, "train")]
        weights = [args.real_weight, round(1 - args.real_weight, 6)]
        if args.forward_translate is not None:
            # The English captions forward-translated: real source, synthetic target, no tag.
            model, digest = self.en_de_model(args.forward_translate, steps)
            forward_name = f"ft-c{args.captions}" + ("-ct2" if args.ct2 else "")
            steps.append(
                self.translate(
                    self.path(mono_en),
                    forward_name,
                    model,
                    ["--beam", "5", "--synthetic-side", "target"],
                    {"--forward-translate sha256": digest},
                )
            )
            subsets.append(self.path(forward_name, "train"))
            share = round((1 - args.real_weight) / 2, 6)
            weights = [args.real_weight, share, share]
            variant += "-ft"
        final_name = f"{name}{variant}-w{args.real_weight:g}"
        blend = [
            "--train-subsets",
            ",".join(subsets),
            "--subset-weights",
            ",".join(f"{w:g}" for w in weights),
        ]
        final = self.training(
            final_name, args.minutes, self.path("data"), [*blend, *args.train_flags], en_de
        )
        if args.side_by_side:
            steps.append(self.side_by_side(baseline, final))
        elif self.baseline and args.filter is None:
            steps += [baseline, final]
        else:
            steps.append(final)
        if self.baseline:
            steps.append(self.score("baseline"))
        steps.append(self.score(final_name))
        return steps

    def filtered(self, name: str, synthetic: str, reverse_dir: str) -> recipe.Step:
        from nmt_cli import filter as nmt_filter

        def run() -> None:
            log(
                f"filtering {self.path(name)}: the best {self.args.filter:g} by dual conditional cross-entropy"
            )
            argv = [
                *(self.path(name), "--forward", self.path("baseline", "checkpoint_last.pt")),
                *("--reverse", self.path(reverse_dir, "checkpoint_last.pt")),
                *("--keep-fraction", str(self.args.filter), "--destdir", synthetic),
                *("--scores", self.path(f"{name}.dcce")),
            ]
            recipe.call("nmt-filter", nmt_filter.main, argv)

        return recipe.Step(
            f"the dataset {synthetic}", {}, [os.path.join(synthetic, "manifest.json")], run
        )

    def side_by_side(self, *models: recipe.Step) -> recipe.Step:
        """The models trained at once, one thread each: equal conditions on a shared machine."""

        def run() -> None:
            context = multiprocessing.get_context("spawn")  # no fork of a process that ran torch
            processes = []
            for step in models:
                log(f"training {step.name} side by side")
                minutes, data, save_dir, flags = self.train_arguments[step.name]
                process = context.Process(
                    target=train_one_thread, args=(minutes, data, save_dir, flags)
                )
                process.start()
                processes.append(process)
            for process in processes:
                process.join()
            if any(process.exitcode for process in processes):
                raise recipe.StepFailed("nmt-train failed side by side")

        outputs = [path for step in models for path in step.outputs]
        identity = dict(models[0].identity)
        return recipe.Step(" and ".join(step.name for step in models), identity, outputs, run)


def read_scores(path: str) -> list[list[str]]:
    """scores.tsv's rows; ValueError naming the line of one an earlier revision wrote."""
    with open(path, encoding="utf-8") as handle:
        rows = [line.rstrip("\n").split("\t") for line in handle]
    for number, row in enumerate(rows, start=1):
        if len(row) != 3 + len(SCORE_NAMES):
            raise ValueError(
                f"{path}:{number}: {len(row)} columns, not {3 + len(SCORE_NAMES)} (scores of an earlier "
                "revision, without val): use another --out"
            )
    return rows


def score_figures(row: list[str]) -> dict[str, float | int]:
    """A scores.tsv row as the results file's figures of one model."""
    _, minutes, updates, *scores = row
    return {
        "minutes": float(minutes),
        "updates": int(updates),
        **{name: float(value) for name, value in zip(SCORE_NAMES, scores, strict=True)},
    }


def main(argv: list[str] | None = None) -> int:
    args = recipe.parse_args(build_parser(), argv)

    def run() -> None:
        from nmt.results import write_results

        check(args)
        bt = Recipe(args)
        recipe.run_steps(args.out, bt.steps())
        rows = read_scores(bt.path("scores.tsv"))
        figures = {row[0]: score_figures(row) for row in rows}
        # SPLIT.NAME and SPLIT.reference, file names (scripts/published.py --publish copies them),
        # as the multilingual recipe names its own.
        hypotheses = {
            **{
                f"{split}.{name}": bt.path(f"{name}.{split}.de")
                for split in SPLITS
                for name in figures
            },
            **{f"{split}.reference": path for split, path in bt.reference_paths().items()},
        }
        write_results(bt.path("results.json"), figures=figures, hypotheses=hypotheses)
        print("\n".join("\t".join(row) for row in rows), file=sys.stderr)

    return recipe.run_recipe(PROG, run)


if __name__ == "__main__":
    sys.exit(main())

"""One model for six directions (en<->de, en<->fr, en<->cs) against six bilingual models at equal
compute, its settings chosen on validation data: every candidate of ``CANDIDATES`` trains U updates,
translates Multi30k val in the six directions, and the one with the highest mean val BLEU (ties: the
first declared) is the multilingual model; only it is translated on test_2016_flickr, beside six
bilingual models of U/6 updates each, and its zero-shot de->fr. Test is only reported.

    python examples/multi30k-multilingual/run.py [--max-update U | --minutes N] [--out DIR]
        [--beam K] [--average-last K] [--multi-flags "FLAGS"] [--no-bilingual] [--corpus DIR]
        [-- nmt-train flags]

Equal compute: the same model size and --max-tokens on both sides (nmt-train's defaults, or the flags
after --, which go to every model), U updates for the multilingual model (default 1500) and U/6 for
each bilingual one; with --minutes N instead, N minutes and N/6 (the machine's load then moves the
compute each side gets). The multilingual vocabulary is joint over four languages, so its output
layer, and only it, is a little larger. Equal footing: every model saves every 50 updates and keeps
10, and every model is scored with the same checkpoint rule (--average-last K: its K newest
checkpoints averaged; default 1, checkpoint_last.pt) and the same beam (--beam, default 5), on the
same reference files. Scores: cased sacreBLEU, chrF2 and the off-target rate (%).

--multi-flags "FLAGS": one multilingual candidate of these nmt-train flags (split on spaces) instead
of the grid, so nothing is selected. --no-bilingual: the multilingual model alone.

DIR/results.json: the figures (``selection``: candidate -> direction -> val scores; ``chosen``;
``valid`` and ``test``: system ("multi", "bilingual") -> direction -> scores, test with the zero-shot
direction; ``updates`` and ``checkpoints`` scored per model) and every hypothesis and reference file
scored, named "SPLIT SYSTEM DIRECTION" (system: a candidate, "multi" for the chosen one, "bilingual",
"reference"). DIR/table.md: the val table that chose and the test table that follows. Re-running with
the same --out keeps the datasets and the trained models and evaluates again; another budget or
other model flags over a trained model is refused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nmt import recipe

PROG = "examples/multi30k-multilingual/run.py"
ROOT = Path(__file__).resolve().parents[2]
PAIRS = ("en-de", "de-en", "en-fr", "fr-en", "en-cs", "cs-en")
LANGUAGES = sorted({lang for pair in PAIRS for lang in pair.split("-")})
ZERO_SHOT = "de-fr"  # a direction never trained: the multilingual model only, with --zero-shot
SPLITS = {"valid": "val", "test": "test_2016_flickr"}  # dataset split -> Multi30k file prefix
# The multilingual settings tried, all of one cost per update (the same model, the same batches), so
# that the budget buys every candidate the same compute.
CANDIDATES: dict[str, list[str]] = {
    "encoder-tag": ["--lang-tok", "encoder", "--sampling-temperature", "5"],
    "decoder-tag": ["--lang-tok", "decoder", "--sampling-temperature", "5"],
    # Each direction out of English is the only one into its language; the three into English
    # share their target side.
    "en-x-upsampled": [
        *("--lang-tok", "encoder", "--sampling-temperature", "5"),
        *("--upsample-directions", "en-de:2,en-fr:2,en-cs:2"),
    ],
}
GIVEN = "multi-flags"  # the one candidate of --multi-flags
MULTI, BILINGUAL, REFERENCE = "multi", "bilingual", "reference"
CHECKPOINTING = ["--save-interval-updates", "50", "--keep-interval-updates", "10"]

Scores = dict[str, float]


def update_budget(text: str) -> int:
    """argparse type of --max-update: each bilingual model gets a sixth, so at least 6."""
    try:
        updates = int(text)
    except ValueError:
        updates = 0
    if updates < 6:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 6, not {text!r}")
    return updates


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--max-update", type=update_budget, default=1500)
    budget.add_argument("--minutes", type=recipe.positive_minutes, help="instead of updates")
    parser.add_argument("--out", default="runs/multi30k-multilingual")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument(
        "--average-last", type=int, default=1, help="checkpoints averaged, for every model"
    )
    parser.add_argument("--multi-flags", help="one multilingual candidate instead of the grid")
    parser.add_argument("--no-bilingual", action="store_true", help="the multilingual model alone")
    parser.add_argument("--corpus", default=str(ROOT / "data" / "multi30k"), help="Multi30k's text")
    return parser


def candidates(args: argparse.Namespace) -> dict[str, list[str]]:
    if args.multi_flags is None:
        return CANDIDATES
    return {GIVEN: args.multi_flags.split()}


def budget(args: argparse.Namespace) -> tuple[str, float]:
    """The recipe's budget option and its value."""
    if args.minutes is not None:
        return "--minutes", args.minutes
    return "--max-update", args.max_update


def budget_flags(args: argparse.Namespace, *, share: int) -> list[str]:
    """nmt-train's budget flags for a model given 1/``share`` of the budget."""
    option, value = budget(args)
    if option == "--minutes":
        return ["--stop-time-hours", str(value / 60 / share)]
    return ["--max-update", str(int(value) // share)]


def choose(selection: Mapping[str, Mapping[str, Scores]]) -> str:
    """The candidate of the highest mean val BLEU over its directions; ties: the first declared."""
    return max(selection, key=lambda name: mean_bleu(selection[name]))


def mean_bleu(found: Mapping[str, Scores]) -> float:
    return sum(scores["bleu"] for scores in found.values()) / len(found)


class Layout:
    """Where a run's files go under --out."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.multi_data = os.path.join(out, "multi", "data")

    def model_dir(self, model: str) -> str:
        """A candidate's (under multi/) or a bilingual direction's directory."""
        return os.path.join(self.out, model if model in PAIRS else os.path.join("multi", model))

    def data(self, model: str) -> str:
        return os.path.join(self.out, model, "data") if model in PAIRS else self.multi_data

    def ckpt(self, model: str) -> str:
        return os.path.join(self.model_dir(model), "ckpt")

    def hypotheses(self, split: str, model: str, pair: str) -> str:
        return os.path.join(self.out, "hypotheses", f"{split}.{model}.{pair}.{pair[-2:]}")

    def reference(self, split: str, pair: str) -> str:
        return os.path.join(self.out, "references", f"{split}.{pair}.{pair[-2:]}")


class Scoreboard:
    """What the evaluation steps found: scores by split, model and direction, the files scored."""

    def __init__(self) -> None:
        self.scores: dict[str, dict[str, dict[str, Scores]]] = {}
        self.hypotheses: dict[str, str] = {}  # hypotheses_name() -> path
        self.chosen = ""
        # "multi" or "bilingual" -> model -> the checkpoint files it was scored with
        self.checkpoints: dict[str, dict[str, list[str]]] = {}

    def add(self, split: str, system: str, pair: str, path: str, scores: Scores) -> None:
        self.scores.setdefault(split, {}).setdefault(system, {})[pair] = scores
        self.hypotheses[hypotheses_name(split, system, pair)] = path


def hypotheses_name(split: str, system: str, pair: str) -> str:
    """A scored file's name in the results file: "valid.encoder-tag.en-de", "test.multi.de-fr",
    "test.reference.en-de" (also a file name when scripts/published.py publishes it)."""
    return f"{split}.{system}.{pair}"


class Translations:
    """Each hypothesis file's making (nmt-eval's flags, the weights' sha256), so that a rerun
    scores the files of unchanged models without decoding again (minutes at beam 5)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.made_from: dict[str, Any] = {}
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as handle:
                    self.made_from = dict(json.load(handle))
            except (ValueError, TypeError) as error:
                raise ValueError(f"{path}: not a record of translations ({error})") from None

    def current(self, hypotheses: str, made_from: Mapping[str, Any]) -> bool:
        found = self.made_from.get(os.path.basename(hypotheses))
        return found == made_from and os.path.exists(hypotheses)

    def record(self, hypotheses: str, made_from: Mapping[str, Any] | None) -> None:
        """``hypotheses`` made from ``made_from``; None: being remade (a kill leaves it stale)."""
        from nmt.fileio import atomic_write

        self.made_from[os.path.basename(hypotheses)] = made_from
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with atomic_write(self.path, "w", encoding="utf-8") as handle:
            json.dump(self.made_from, handle, indent=1)


def steps(args: argparse.Namespace, board: Scoreboard) -> list[recipe.Step]:
    """The datasets, the models, the val scores, the choice, then the test scores into ``board``."""
    from nmt.eval.translate import read_references
    from nmt_cli import eval as nmt_eval
    from nmt_cli import preprocess as nmt_preprocess
    from nmt_cli import train as nmt_train

    layout, corpus = Layout(args.out), args.corpus
    count = recipe.average_last(given=args.average_last)
    grid = candidates(args)
    bilingual = [] if args.no_bilingual else list(PAIRS)
    option, value = budget(args)

    def preprocess(destdir: str, *options: str) -> recipe.Step:
        def run() -> None:
            argv = [
                *options,
                *("--trainpref", f"{corpus}/train", "--validpref", f"{corpus}/{SPLITS['valid']}"),
                *("--testpref", f"{corpus}/{SPLITS['test']}", "--destdir", destdir, "--overwrite"),
            ]
            recipe.call("nmt-preprocess", nmt_preprocess.main, argv)

        output = os.path.join(destdir, "manifest.json")
        return recipe.Step(f"the dataset {destdir}", {"corpus": corpus}, [output], run)

    def train(model: str, share: int, flags: Sequence[str]) -> recipe.Step:
        model_flags = [*CHECKPOINTING, *flags, *args.train_flags]

        def run() -> None:
            argv = [
                *(layout.data(model), "--save-dir", layout.ckpt(model)),
                *budget_flags(args, share=share),
                *("--no-epoch-checkpoints", "--log-file"),
                *(os.path.join(layout.model_dir(model), "train.log"), *model_flags),
            ]
            recipe.call("nmt-train", nmt_train.main, argv)

        # Another budget over a trained model would be scored as the new one: nmt-train stops at
        # once under a shorter one and goes on from the old model under a longer one.
        output = os.path.join(layout.ckpt(model), "checkpoint_last.pt")
        return recipe.Step(
            f"the {model} model", {option: value, "model flags": model_flags}, [output], run
        )

    written: dict[tuple[str, str], list[str]] = {}
    translations = Translations(os.path.join(args.out, "hypotheses", "made_from.json"))

    def references(split: str, pair: str) -> list[str]:
        """The lines every system of ``pair`` is scored against, written under --out once."""
        if (split, pair) not in written:
            if pair == ZERO_SHOT:
                found = read_references(f"{corpus}/{SPLITS[split]}.{pair[-2:]}.gz")
            else:
                found = recipe.split_references(layout.multi_data, split, pair=pair)
            path = layout.reference(split, pair)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.writelines(f"{line}\n" for line in found)
            board.hypotheses[hypotheses_name(split, REFERENCE, pair)] = path
            written[split, pair] = found
        return written[split, pair]

    def score(split: str, pair: str, system: str, model: Callable[[], str]) -> recipe.Step:
        """``model`` (a candidate or a bilingual direction; a function: the chosen candidate is
        known only once the val steps ran) translates ``pair`` of ``split`` by the common rule, and
        its scores and hypotheses are ``system``'s."""

        def run() -> None:
            name = model()
            source, target = pair.split("-")
            if pair == ZERO_SHOT:
                where = ["--input", f"{corpus}/{SPLITS[split]}.{source}.gz", "--zero-shot"]
            else:
                where = [layout.data(name), "--split", split]
            if name not in PAIRS:
                where += ["-s", source, "-t", target]
            hypotheses = layout.hypotheses(split, BILINGUAL if name in PAIRS else name, pair)
            argv = [
                *(*where, *recipe.weight_flags(layout.ckpt(name), count)),
                *("--beam", str(args.beam), "--output", hypotheses),
            ]
            weights = recipe.weight_paths(layout.ckpt(name), count)
            kind = BILINGUAL if name in PAIRS else MULTI
            board.checkpoints.setdefault(kind, {})[name] = [os.path.basename(w) for w in weights]
            made_from = {"argv": argv, "sha256": [recipe.file_sha256(path) for path in weights]}
            if not translations.current(hypotheses, made_from):
                translations.record(hypotheses, None)
                recipe.call("nmt-eval", nmt_eval.main, argv)
                translations.record(hypotheses, made_from)
            wanted = references(split, pair)
            if name in PAIRS and recipe.split_references(layout.data(name), split) != wanted:
                raise ValueError(
                    f"{layout.data(name)}: its {split} references differ from "
                    f"{layout.multi_data}'s {pair}: the systems would not be scored alike"
                )
            found = recipe.scores(hypotheses, wanted, target_lang=target, languages=LANGUAGES)
            board.add(split, system, pair, hypotheses, found)

        # Scored every time, as the models are now; translated again only when the weights or
        # nmt-eval's flags differ from those the hypotheses were made with.
        return recipe.Step(hypotheses_name(split, system, pair), {}, [], run, always=True)

    def select() -> None:
        board.chosen = choose({name: board.scores["valid"][name] for name in grid})
        for pair in PAIRS:  # the chosen candidate's val hypotheses are the multi system's
            board.add(
                "valid",
                MULTI,
                pair,
                board.hypotheses[hypotheses_name("valid", board.chosen, pair)],
                board.scores["valid"][board.chosen][pair],
            )

    found = [preprocess(layout.multi_data, "--lang-pairs", ",".join(PAIRS))]
    found += [train(name, 1, flags) for name, flags in grid.items()]
    for pair in bilingual:
        source, target = pair.split("-")
        found += [
            preprocess(layout.data(pair), "-s", source, "-t", target),
            train(pair, len(PAIRS), []),
        ]
    for name in grid:
        found += [score("valid", pair, name, lambda name=name: name) for pair in PAIRS]
    found += [score("valid", pair, BILINGUAL, lambda pair=pair: pair) for pair in bilingual]
    found.append(recipe.Step("the choice", {}, [], select, always=True))
    for pair in [*PAIRS, ZERO_SHOT]:
        found.append(score("test", pair, MULTI, lambda: board.chosen))
        if pair in bilingual:
            found.append(score("test", pair, BILINGUAL, lambda pair=pair: pair))
    return found


def cells(found: Scores | None) -> str:
    if found is None:
        return "- | - | -"
    return f"{found['bleu']:.2f} | {found['chrf']:.2f} | {found['off_target']:.2f}"


def bleu_table(board: Scoreboard, grid: Sequence[str]) -> dict[str, list]:
    """BLEU of every candidate on val (the mean that chose), the bilingual models' beside them, and
    of the chosen candidate and the bilingual models on test: ``figures.table``, which
    scripts/published.py renders into the README."""
    columns = ["split", "system", *PAIRS, "mean", f"{ZERO_SHOT} (zero-shot)"]
    labels = {name: f"{name} (chosen)" if name == board.chosen else name for name in grid}
    labels[BILINGUAL] = "bilingual"
    rows = []
    for split, systems in (("val", [*grid, BILINGUAL]), ("test", [MULTI, BILINGUAL])):
        for system in systems:
            found = board.scores["valid" if split == "val" else "test"].get(system)
            if found is None:  # --no-bilingual
                continue
            bleu = [f"{found[pair]['bleu']:.2f}" for pair in PAIRS]
            zero_shot = found.get(ZERO_SHOT)
            rows.append(
                [
                    *(split, labels.get(system, f"multilingual ({board.chosen})"), *bleu),
                    f"{mean_bleu({pair: found[pair] for pair in PAIRS}):.2f}",
                    "-" if zero_shot is None else f"{zero_shot['bleu']:.2f}",
                ]
            )
    return {"columns": columns, "rows": rows}


def markdown(table: Mapping[str, list]) -> str:
    lines = [table["columns"], ["---"] * len(table["columns"]), *table["rows"]]
    return "".join(f"| {' | '.join(line)} |\n" for line in lines)


def test_table(test: Mapping[str, Mapping[str, Scores]]) -> str:
    """The chosen multilingual model's test scores beside the bilingual ones, a row per direction."""
    lines = [
        "| test | multilingual BLEU | chrF2 | off-target % | bilingual BLEU | chrF2 | off-target % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for pair in PAIRS:
        bilingual = test.get(BILINGUAL, {}).get(pair)
        lines.append(f"| {pair} | {cells(test[MULTI][pair])} | {cells(bilingual)} |")
    lines.append(f"| {ZERO_SHOT} (zero-shot) | {cells(test[MULTI][ZERO_SHOT])} | {cells(None)} |")
    return "\n".join(lines) + "\n"


def updates(args: argparse.Namespace, models: Mapping[str, Sequence[str]]) -> dict:
    """Per system ("multi", "bilingual") and model: the updates it reached."""
    layout = Layout(args.out)
    return {
        system: {
            name: recipe.num_updates(os.path.join(layout.ckpt(name), "checkpoint_last.pt"))
            for name in names
        }
        for system, names in models.items()
        if names
    }


def main(argv: list[str] | None = None) -> int:
    args = recipe.parse_args(build_parser(), argv)

    def run() -> None:
        from nmt.results import write_results

        board = Scoreboard()
        recipe.run_steps(args.out, steps(args, board))
        grid = candidates(args)
        selection = {name: board.scores["valid"][name] for name in grid}
        table = bleu_table(board, list(grid))
        rule = (
            "checkpoint_last.pt"
            if args.average_last == 1
            else f"the average of its last {args.average_last} checkpoints"
        )
        text = (
            f"BLEU (beam {args.beam}, every model scored with {rule}); the highest mean on val "
            f"chose:\n\n{markdown(table)}\n"
            f"Test, the chosen multilingual model ({board.chosen}) and the bilingual models:\n\n"
            f"{test_table(board.scores['test'])}"
        )
        with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as handle:
            handle.write(text)
        bilingual = [] if args.no_bilingual else list(PAIRS)
        option, value = budget(args)
        figures = {
            option[2:].replace("-", "_"): value,
            "beam": args.beam,
            "average_last": args.average_last,
            "candidates": grid,
            "selection": selection,
            "chosen": board.chosen,
            "valid": {
                system: board.scores["valid"][system]
                for system in (MULTI, BILINGUAL)
                if system in board.scores["valid"]
            },
            "test": board.scores["test"],
            "zero_shot": ZERO_SHOT,
            "table": table,
            "updates": updates(args, {MULTI: list(grid), BILINGUAL: bilingual}),
            "checkpoints": board.checkpoints,
        }
        write_results(
            os.path.join(args.out, "results.json"), figures=figures, hypotheses=board.hypotheses
        )
        print(text, end="")

    return recipe.run_recipe(PROG, run)


if __name__ == "__main__":
    sys.exit(main())

"""One model for six directions (en<->de, en<->fr, en<->cs) against six bilingual models at equal
compute: the multilingual model trains N minutes, each bilingual model N/6; then every direction of
test_2016_flickr is translated (beam 5) and scored (cased sacreBLEU, chrF2, off-target %), and the
multilingual model's zero-shot de->fr.

    python examples/multi30k-multilingual/run.py [--minutes N] [--out DIR] [--lang-tok encoder|decoder]
        [--beam K] [--average-last K] [--multi-flags "FLAGS"] [--no-bilingual] [--corpus DIR]
        [-- nmt-train flags]

--multi-flags "FLAGS": nmt-train flags for the multilingual model only (split on spaces); flags
after -- go to every model. Default for budgets of 30 minutes and more: a 192-wide model (FFN 768)
with warm-up 1,200, and the directions out of English sampled twice as often (1.5 times from 60
minutes: --upsample-directions), measured at 30 and 60 minutes (README); below that, "" (nmt-train's
defaults). --average-last K: the multilingual model is scored on the average of its last K
checkpoints (saved every 50 updates); default 5 for budgets of 20 minutes and more, else 1
(checkpoint_last.pt). --no-bilingual: the multilingual model alone. The table goes to DIR/table.md.
Re-running with the same --out keeps the datasets and resumes the runs (a finished run is only
evaluated); another --minutes, --lang-tok or model flags over trained models is refused.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from nmt import recipe

PROG = "examples/multi30k-multilingual/run.py"
ROOT = Path(__file__).resolve().parents[2]
PAIRS = ("en-de", "de-en", "en-fr", "fr-en", "en-cs", "cs-en")
LANGUAGES = sorted({lang for pair in PAIRS for lang in pair.split("-")})
ZERO_SHOT = "de-fr"  # a direction never trained: the multilingual model only, with --zero-shot


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=recipe.positive_minutes, default=30.0)
    parser.add_argument("--out", default="runs/multi30k-multilingual")
    parser.add_argument("--lang-tok", choices=("encoder", "decoder"), default="encoder")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument(
        "--average-last", type=int, help="the multilingual model's checkpoints averaged"
    )
    parser.add_argument("--multi-flags", help="nmt-train flags for the multilingual model only")
    parser.add_argument("--no-bilingual", action="store_true", help="the multilingual model alone")
    parser.add_argument("--corpus", default=str(ROOT / "data" / "multi30k"), help="Multi30k's text")
    return parser


def multi_flags(minutes: float) -> list[str]:
    """The multilingual model's own flags by budget (README.md here has the runs behind them)."""
    if minutes < 30:
        # At 6 minutes the 128-wide default already wins all six directions.
        return []
    # The bilingual default's 128 dimensions, shared by four languages, lost 2 of 6 directions to
    # the bilingual models at 30 minutes and 4 of 6 at 60; 192 dimensions, with the warm-up
    # stretched 4x so that each direction's learning rate follows the bilingual model's inverse
    # square root over the ~4x updates, win 6 and 5 in two runs at 30 and 5 at 60, none of the
    # losses significant (the two changes were measured together, not apart).
    wide = [
        *("--encoder-embed-dim", "192", "--decoder-embed-dim", "192"),
        *("--encoder-ffn-embed-dim", "768", "--decoder-ffn-embed-dim", "768"),
        *("--warmup-updates", "1200"),
    ]
    # Each direction out of English is the only one into its language, while the three into English
    # share their target side: sampled twice as often, en->X stopped losing (en-cs at 30 minutes,
    # en-fr at 60) and X->en kept winning at 30. At 60 minutes x2 left fr-en tied; x1.5 gives the
    # directions into English some samples back and wins all six.
    factor = "1.5" if minutes >= 60 else "2"
    upsampled = ",".join(f"{pair}:{factor}" for pair in PAIRS if pair.startswith("en-"))
    return [*wide, "--upsample-directions", upsampled]


def splits(corpus: str) -> list[str]:
    return [
        *("--trainpref", f"{corpus}/train", "--validpref", f"{corpus}/val"),
        *("--testpref", f"{corpus}/test_2016_flickr"),
    ]


def steps(
    args: argparse.Namespace, table: dict[str, dict[str, dict[str, float]]]
) -> list[recipe.Step]:
    """The datasets, the models, then every score into ``table`` (system -> direction -> scores)."""
    from nmt.eval.translate import read_references
    from nmt_cli import eval as nmt_eval
    from nmt_cli import preprocess as nmt_preprocess
    from nmt_cli import train as nmt_train

    out, corpus = args.out, args.corpus
    own_flags = multi_flags(args.minutes) if args.multi_flags is None else args.multi_flags.split()
    count = recipe.average_last(minutes=args.minutes, given=args.average_last)
    pairs = [] if args.no_bilingual else list(PAIRS)

    def preprocess(destdir: str, *options: str) -> recipe.Step:
        def run() -> None:
            argv = [*options, *splits(corpus), "--destdir", destdir, "--overwrite"]
            recipe.call("nmt-preprocess", nmt_preprocess.main, argv)

        output = os.path.join(destdir, "manifest.json")
        return recipe.Step(f"the dataset {destdir}", {"corpus": corpus}, [output], run)

    def train(name: str, minutes: float, *flags: str) -> recipe.Step:
        data, ckpt = os.path.join(out, name, "data"), os.path.join(out, name, "ckpt")

        def run() -> None:
            argv = [
                *(data, "--save-dir", ckpt, "--stop-time-hours", str(minutes / 60)),
                *("--no-epoch-checkpoints", "--log-file", os.path.join(out, name, "train.log")),
                *flags,
                *args.train_flags,
            ]
            recipe.call("nmt-train", nmt_train.main, argv)

        # Another budget over a trained model would be scored as the new one: nmt-train stops at
        # once under a shorter one and goes on from the old model under a longer one.
        identity = {"--minutes": args.minutes, "model flags": [*flags, *args.train_flags]}
        output = os.path.join(ckpt, "checkpoint_last.pt")
        return recipe.Step(f"the {name} model", identity, [output], run)

    def score(
        system: str, pair: str, argv: list[str], references: Callable[[], list[str]]
    ) -> recipe.Step:
        target = pair.split("-")[1]
        hypotheses = hypothesis_path(out, system, pair)

        def run() -> None:
            recipe.call(
                "nmt-eval", nmt_eval.main, [*argv, "--beam", str(args.beam), "--output", hypotheses]
            )
            table.setdefault(system, {})[pair] = recipe.scores(
                hypotheses, references(), target_lang=target, languages=LANGUAGES
            )

        # Scored every time, as the models are now (a run that trained on is scored again).
        return recipe.Step(f"{system} {pair}", {}, [], run, always=True)

    multi_data = os.path.join(out, "multi", "data")
    multi_weights = recipe.weight_flags(os.path.join(out, "multi", "ckpt"), count)
    found = [
        preprocess(multi_data, "--lang-pairs", ",".join(PAIRS)),
        train(
            "multi",
            args.minutes,
            *("--lang-tok", args.lang_tok, "--sampling-temperature", "5"),
            *("--save-interval-updates", "50", "--keep-interval-updates", "10"),
            *own_flags,
        ),
    ]
    for pair in pairs:
        source, target = pair.split("-")
        found += [
            preprocess(os.path.join(out, pair, "data"), "-s", source, "-t", target),
            train(pair, args.minutes / 6),
        ]
    for pair in PAIRS:
        source, target = pair.split("-")
        found.append(
            score(
                "multi",
                pair,
                [multi_data, *multi_weights, "--split", "test", "-s", source, "-t", target],
                lambda pair=pair: recipe.split_references(multi_data, "test", pair=pair),
            )
        )
        if pair in pairs:
            data = os.path.join(out, pair, "data")
            weights = recipe.weight_flags(os.path.join(out, pair, "ckpt"), 1)
            found.append(
                score(
                    pair,
                    pair,
                    [data, *weights, "--split", "test"],
                    lambda data=data: recipe.split_references(data, "test"),
                )
            )
    source, target = ZERO_SHOT.split("-")
    reference = f"{corpus}/test_2016_flickr.{target}.gz"
    found.append(
        score(
            "multi",
            ZERO_SHOT,
            [
                *(*multi_weights, "-s", source, "-t", target, "--zero-shot"),
                *("--input", f"{corpus}/test_2016_flickr.{source}.gz", "--reference", reference),
            ],
            lambda: read_references(reference),
        )
    )
    return found


def hypothesis_path(out: str, system: str, pair: str) -> str:
    return os.path.join(out, system, f"test.{pair}.hyp.{pair.split('-')[1]}")


def markdown_table(table: dict[str, dict[str, dict[str, float]]]) -> str:
    """The multilingual model's scores beside the bilingual ones, a row per direction."""

    def cells(found: dict[str, float] | None) -> str:
        if found is None:
            return "- | - | -"
        return f"{found['bleu']:.2f} | {found['chrf']:.2f} | {found['off_target']:.2f}"

    lines = [
        "| direction | multilingual BLEU | chrF2 | off-target % | bilingual BLEU | chrF2 | off-target % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for pair in PAIRS:
        bilingual = table.get(pair, {}).get(pair)
        lines.append(f"| {pair} | {cells(table['multi'][pair])} | {cells(bilingual)} |")
    lines.append(
        f"| {ZERO_SHOT} (zero-shot) | {cells(table['multi'][ZERO_SHOT])} | {cells(None)} |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = recipe.parse_args(build_parser(), argv)

    def run() -> None:
        from nmt.results import write_results

        table: dict[str, dict[str, dict[str, float]]] = {}
        recipe.run_steps(args.out, steps(args, table))
        text = markdown_table(table)
        with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as handle:
            handle.write(text)
        hypotheses = {
            f"{system} {pair}": hypothesis_path(args.out, system, pair)
            for system, found in table.items()
            for pair in found
        }
        write_results(os.path.join(args.out, "results.json"), figures=table, hypotheses=hypotheses)
        print(text, end="")

    return recipe.run_recipe(PROG, run)


if __name__ == "__main__":
    sys.exit(main())

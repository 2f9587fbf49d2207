"""How far models trained with --term-annotation-rate follow the terms they are given (issue 51 b).

    python benchmarks/term_following.py --data runs/data [--split valid] [--beam 5] [--seed 1] \
        [--out-dir runs/term-following] [--results FILE] NAME=CHECKPOINT [NAME=CHECKPOINT ...]

For each checkpoint (PyTorch), on one split: its plain beam output; 1-2 reference phrases per
sentence that this output misses, drawn as benchmarks/constraints.py draws them (so every phrase
asks the model to change its own translation); the output with those phrases after ``<term>``, as
training appends them. Printed per checkpoint: the share of the phrases that the annotated output
contains (the plain output contains none, by construction), and BLEU and chrF2 with and without
the annotation. Checkpoints of one run at several updates give its learning curve; checkpoints of
runs with other --term-annotation-rate / --term-mask-rate settings compare those on val.
"""

from __future__ import annotations

import argparse
import os

import torch
from constraints import draw_constraints, split_with_references, term_success
from terminology import write_lines

from nmt.eval.translate import Translator
from nmt.results import write_results

RESERVED = ("split", "beam", "batch_size", "seed", "table")  # the results file's other figures


def parse_models(specs: list[str]) -> dict[str, str]:
    models = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"term_following.py: error: {spec!r}: expected NAME=CHECKPOINT")
        if "." in name or name in RESERVED:
            raise SystemExit(
                f"term_following.py: error: {spec!r}: a NAME is a key of the results file: "
                f"no '.', none of {', '.join(RESERVED)}"
            )
        if name in models:
            raise SystemExit(f"term_following.py: error: the name {name!r} is given twice")
        models[name] = path
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", metavar="NAME=CHECKPOINT")
    parser.add_argument("--data", default="runs/data")
    parser.add_argument("--split", default="valid")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1, help="the phrases' draw")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out-dir", default="runs/term-following", help="outputs and phrases")
    parser.add_argument("--results", help="results file (default: OUT_DIR/term_following.json)")
    args = parser.parse_args()
    models = parse_models(args.models)
    os.makedirs(args.out_dir, exist_ok=True)
    options = {"beam": args.beam, "batch_size": args.batch_size}

    figures: dict[str, object] = {"split": args.split, **options, "seed": args.seed}
    hypotheses: dict[str, str] = {}
    columns = ["model", "phrases", "terms %", "all-terms sent %", "BLEU plain", "BLEU terms"]
    columns += ["chrF2 plain", "chrF2 terms"]
    rows = []
    width = max(map(len, [columns[0], *models]))
    print(f"{columns[0]:<{width}} " + " ".join(f"{c:>{len(c)}}" for c in columns[1:]))
    for name, path in models.items():
        try:
            translator = Translator.from_checkpoint(path, device=args.device)
            sources, references = split_with_references(args.data, args.split, translator)
        except (OSError, ValueError) as error:
            raise SystemExit(f"term_following.py: error: {name}: {error}") from None
        outputs = {}
        plain = translator.generate(list(sources), progress=True, **options)
        outputs["plain"] = [nbest[0].text for nbest in translator.detokenize(plain)]
        phrases = draw_constraints(references, outputs["plain"], seed=args.seed)
        annotated, _ = translator.apply_target_terms(sources, phrases, mode="annotate", what=name)
        found = translator.generate(annotated, progress=True, **options)
        outputs["terms"] = [nbest[0].text for nbest in translator.detokenize(found)]
        row: dict[str, float] = {"phrases": sum(map(len, phrases))}
        for kind, texts in outputs.items():
            bleu, chrf = translator.score(texts, references)[:2]
            row[f"bleu_{kind}"], row[f"chrf2_{kind}"] = bleu.score, chrf.score
            hypotheses[f"{name}.{kind}"] = write_lines(
                os.path.join(args.out_dir, f"{name}.{kind}.txt"), texts
            )
        row["terms"], row["all_terms_sentences"] = term_success(outputs["terms"], phrases)
        hypotheses[f"{name}.constraints"] = write_lines(
            os.path.join(args.out_dir, f"{name}.constraints.tsv"), ["\t".join(p) for p in phrases]
        )
        figures[name] = row
        rows.append(
            [name, f"{row['phrases']:,}"]
            + [f"{row[key]:.1f}" for key in ("terms", "all_terms_sentences")]
            + [f"{row[key]:.2f}" for key in ("bleu_plain", "bleu_terms", "chrf2_plain")]
            + [f"{row['chrf2_terms']:.2f}"]
        )
        print(
            f"{name:<{width}} "
            + " ".join(f"{v:>{len(c)}}" for v, c in zip(rows[-1][1:], columns[1:])),
            flush=True,
        )
    hypotheses["reference"] = write_lines(os.path.join(args.out_dir, "reference.txt"), references)
    print(
        f"{args.data} {args.split}: beam {args.beam}, {args.device}, torch threads "
        f"{torch.get_num_threads()}, phrases seed {args.seed}"
    )
    figures["table"] = {"columns": columns, "rows": rows}
    results = args.results or os.path.join(args.out_dir, "term_following.json")
    write_results(results, figures=figures, hypotheses=hypotheses)
    print(f"wrote {results}")


if __name__ == "__main__":
    main()

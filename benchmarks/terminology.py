"""Terminology on Multi30k (issue 51 part 4): constrained beam against the plain beam, per split.

    python benchmarks/terminology.py --path runs/ckpt/checkpoint_best.pt --data runs/data \
        [--annotated-path runs/ckpt-terms/checkpoint_best.pt [--ct2-quantization int8]] \
        [--splits valid,test] [--beam 5] [--seed 1] [--repeats 1] [--threads N] \
        [--out-dir runs/terminology] [--results runs/terminology/terminology.json]

Constraints are drawn from each split's references as the papers draw them (benchmarks/constraints.py:
1-2 random reference phrases of 1-3 words per sentence that the plain beam's output misses, fixed
--seed). One table, a row per split and search: sentences/s and its ratio to the plain beam of the
same split in the same run, term success (% of phrases in the output, % of constrained sentences
with all of theirs), BLEU and chrF2.

--annotated-path (a model trained with --term-annotation-rate on the same dataset: a checkpoint,
exported here with nmt.deploy's CTranslate2 export, or an nmt-export directory) adds three rows
with the same drawn terms: ``A-ct2 plain`` (that model through CTranslate2 on the unannotated
sources: the BLEU its annotations must stay within 0.5 of), ``A-ct2 terms`` (the terms appended
after ``<term>`` as training appends them) and, from a checkpoint, ``A-both`` (annotated and
searched under the terms as constraints, PyTorch). Every ratio is to the plain beam's sent/s.
The hypotheses and the constraints (one line per sentence,
phrases tab-separated: nmt-eval --constraints reads them after the source) go to --out-dir; the
figures to a results file (nmt.results: command, revision, machine, date, figures, hypotheses).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import numpy as np
import torch
from constraints import HEADER, Comparison, compare, split_with_references, term_success

from nmt.data.spm import SentencePieceModel
from nmt.deploy.ct2 import QUANTIZATIONS, export_ctranslate2
from nmt.eval.translate import Translator
from nmt.results import write_results

FLOAT = "float32"  # --ct2-quantization: the export keeps the checkpoint's float weights


def write_lines(path: str, lines: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(f"{line}\n" for line in lines)
    return path


def annotated_models(
    path: str, *, vocabulary: SentencePieceModel, out_dir: str, quantization: str, device: str
) -> dict[str, Translator]:
    """The annotated model's rows and their Translators: "A-ct2" (CTranslate2: ``path`` itself if
    an export, else exported under ``out_dir``) and, from a checkpoint, "A-both" (PyTorch)."""
    if os.path.isdir(path):
        models = {"A-ct2": Translator.from_checkpoint(path, device=device)}
    else:
        exported = os.path.join(out_dir, f"annotated-ct2-{quantization}")
        export_ctranslate2(
            [path],
            exported,
            quantization=None if quantization == FLOAT else quantization,
            force=True,
        )
        models = {
            "A-ct2": Translator.from_checkpoint(exported, device=device),
            "A-both": Translator.from_checkpoint(path, device=device),
        }
    for model in models.values():  # a model that never saw <term> is refused here, in one line
        model.check_glossary_mode("annotate", option="--annotated-path")
        # The splits are read once, as the plain model's vocabulary encoded them.
        if model.src_spm.proto != vocabulary.proto:
            raise ValueError(
                f"--annotated-path {path}: another source SentencePiece model than --path's; "
                "train both models on the same dataset"
            )
    return models


def annotated_rows(
    models: dict[str, Translator],
    split_sources: Sequence[np.ndarray],
    result: Comparison,
    references: list[str],
    *,
    repeats: int,
    **options: int,
) -> None:
    """Adds the annotated model's rows to ``result`` (outputs, times, figures), with the terms
    ``result`` drew; best of ``repeats`` timed runs each."""
    plain_speed = result.figures["plain"]["sent_per_s"]
    runs = [("A-ct2 plain", "A-ct2", None), ("A-ct2 terms", "A-ct2", "annotate")]
    if "A-both" in models:
        runs.append(("A-both", "A-both", "both"))
    for row, model, mode in runs:
        translator = models[model]
        sources, constraints = split_sources, None
        if mode is not None:
            sources, constraints = translator.apply_target_terms(
                sources, result.constraints, mode=mode, what="--annotated-path"
            )
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            found = translator.generate(sources, constraints=constraints, **options)
            times.append(time.perf_counter() - started)
        outputs = [nbest[0].text for nbest in translator.detokenize(found)]
        bleu, chrf = translator.score(outputs, references)[:2]
        phrases, sentences = term_success(outputs, result.constraints)
        speed = len(sources) / min(times)
        result.outputs[row], result.times[row] = outputs, times
        result.figures[row] = {
            "sent_per_s": speed,
            "ratio": speed / plain_speed,
            "terms": phrases,
            "all_terms_sentences": sentences,
            "bleu": bleu.score,
            "chrf2": chrf.score,
        }


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
    parser.add_argument(
        "--annotated-path",
        help="a model trained with --term-annotation-rate (checkpoint or nmt-export directory)",
    )
    parser.add_argument(
        "--ct2-quantization",
        default="int8",
        choices=(FLOAT, *QUANTIZATIONS),
        help="the export of an --annotated-path checkpoint (float32: not quantized)",
    )
    parser.add_argument("--out-dir", default="runs/terminology", help="hypotheses, constraints")
    parser.add_argument("--results", help="results file (default: OUT_DIR/terminology.json)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)

    translator = Translator.from_checkpoint(args.path, device=args.device)
    annotated: dict[str, Translator] = {}
    if args.annotated_path is not None:
        try:
            annotated = annotated_models(
                args.annotated_path,
                vocabulary=translator.src_spm,
                out_dir=args.out_dir,
                quantization=args.ct2_quantization,
                device=args.device,
            )
        except (OSError, ValueError) as error:
            raise SystemExit(f"terminology.py: error: {error}") from None
    figures: dict[str, object] = {"beam": args.beam, "batch_size": args.batch_size}
    hypotheses: dict[str, str] = {}
    table = []
    bleu_lines: list[str] = []
    for name in args.splits.split(","):
        sources, references = split_with_references(args.data, name, translator)
        result = compare(
            translator,
            sources,
            references,
            seed=args.seed,
            repeats=args.repeats,
            beam=args.beam,
            batch_size=args.batch_size,
        )
        if annotated:
            annotated_rows(
                annotated,
                sources,
                result,
                references,
                repeats=args.repeats,
                beam=args.beam,
                batch_size=args.batch_size,
            )
        figures[name] = {
            "sentences": len(sources),
            "constraint_phrases": sum(map(len, result.constraints)),
            "constrained_sentences": sum(1 for c in result.constraints if c),
            "times_s": result.times,
            **result.figures,
        }
        for search, outputs in result.outputs.items():
            file_name = f"{name}.{search.replace(' ', '-')}"
            hypotheses[file_name] = write_lines(
                os.path.join(args.out_dir, f"{file_name}.txt"), outputs
            )
        # The references beside the outputs: scripts/published.py's paired bootstrap reads them.
        hypotheses[f"{name}.reference"] = write_lines(
            os.path.join(args.out_dir, f"{name}.reference.txt"), references
        )
        hypotheses[f"{name}.constraints"] = write_lines(
            os.path.join(args.out_dir, f"{name}.constraints.tsv"),
            ["\t".join(phrases) for phrases in result.constraints],
        )
        table += [f"{name:<6} {line}" for line in result.lines()]
        print(f"{name}: {figures[name]['constraint_phrases']} phrases", flush=True)
        if "A-ct2 plain" in result.figures:
            plain_bleu = result.figures["plain"]["bleu"]
            annotated_bleu = result.figures["A-ct2 plain"]["bleu"]
            bleu_lines.append(
                f"{name}: BLEU on unannotated input: annotated model (CTranslate2) "
                f"{annotated_bleu:.2f}, plain model {plain_bleu:.2f} "
                f"({annotated_bleu - plain_bleu:+.2f})"
            )

    print(
        f"{args.path} on {args.data}: beam {args.beam}, batch {args.batch_size}, {args.device}, "
        f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs, best of {args.repeats}, constraints seed {args.seed}"
    )
    print(f"{'split':<6} {HEADER}")
    print("\n".join(table))
    if annotated:
        export = (
            "an export, its own type"
            if os.path.isdir(args.annotated_path)
            else f"exported {args.ct2_quantization}"
        )
        print(f"A: {args.annotated_path} (CTranslate2: {export})")
        print("\n".join(bleu_lines))
    results = args.results or os.path.join(args.out_dir, "terminology.json")
    write_results(results, figures=figures, hypotheses=hypotheses)
    print(f"wrote {results}")


if __name__ == "__main__":
    main()

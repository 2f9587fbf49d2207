"""nmt-eval: translate a split of a preprocessed dataset, a file or stdin with a checkpoint; score with sacreBLEU."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from nmt.config import EvalConfig
from nmt.fileio import atomic_write
from nmt_cli.options import ArgumentParser, add_config_arguments, config_from_args, run_main
from nmt.checkpoint_io import last_checkpoints
from nmt.eval.translate import Translation, Translator, iter_line_chunks, load_split, read_references


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="nmt-eval",
        description=(
            "Translate with a checkpoint and score with sacreBLEU. Either DATA_DIR --split (binarized data, "
            "scored against the raw reference text it was made from) or raw text from --input / stdin "
            "(scored when --reference is given). Hypotheses go to --output, else stdout; scores go to "
            "stdout, or to stderr when the hypotheses are on stdout."
        ),
    )
    parser.add_argument("data_dir", nargs="?", metavar="DATA_DIR", help="a directory written by nmt-preprocess")
    parser.add_argument("--path", required=True, help="checkpoint file; a,b,c averages their weights; a save dir with --average-last")
    parser.add_argument("--average-last", type=int, metavar="N", help="average the N newest numbered checkpoints in the save dir --path")
    parser.add_argument("--split", default="test", help="split of DATA_DIR to translate")
    parser.add_argument("--input", help="raw text to translate, one sentence a line ('-': stdin; the default without DATA_DIR)")
    parser.add_argument("--reference", help="raw reference text to score against (overrides the split's own)")
    parser.add_argument("--output", help="write hypotheses here (in input order; --nbest N: N lines per input line)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--score-tokenized-lowercase", action="store_true", help="also report BLEU on lowercased, tokenized text (as many Multi30k papers do)")
    add_config_arguments(parser.add_argument_group("search"), EvalConfig)
    return parser


def _checkpoint_paths(args: argparse.Namespace) -> list[str]:
    if args.average_last is None:
        return [path for path in args.path.split(",") if path]
    if args.average_last < 1:
        raise ValueError(f"--average-last: must be >= 1, got {args.average_last}")
    return last_checkpoints(args.path, args.average_last)


def _translations(translator: Translator, args: argparse.Namespace, cfg: EvalConfig) -> tuple[Iterator[list[list[Translation]]], list[str] | None]:
    """Chunks of n-best translations (lazily: raw text streams through) and the references, if any."""
    if args.data_dir is not None:
        split = load_split(args.data_dir, args.split, src_spm=translator.src_spm)
        reference_path = args.reference or split.reference_path
        if reference_path is None:
            raise ValueError(f"{args.data_dir}: the manifest names no raw text for split {args.split!r}; pass --reference")
        references = read_references(reference_path, line_numbers=split.line_numbers)

        def decode_split() -> Iterator[list[list[Translation]]]:
            yield translator.detokenize(translator.generate(split.sources, progress=True))

        return decode_split(), references

    references = None if args.reference is None else read_references(args.reference)

    def stream() -> Iterator[list[list[Translation]]]:
        with contextlib.ExitStack() as stack:
            if args.input in (None, "-"):
                handle, name = sys.stdin.buffer, "<stdin>"
            else:
                handle, name = stack.enter_context(open(args.input, "rb")), args.input
            for chunk in iter_line_chunks(handle, size=cfg.buffer_size, name=name):
                yield translator.translate_nbest(chunk, progress=True)

    return stream(), references


@contextlib.contextmanager
def _open_output(path: str | None) -> Iterator[TextIO]:
    """stdout, or ``path`` written atomically (never half a file)."""
    if path is None:
        yield sys.stdout
        return
    with atomic_write(path, "w", encoding="utf-8", newline="\n") as handle:
        yield handle


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", stream=sys.stderr)
    return run_main("nmt-eval", lambda: _evaluate(args))


def _evaluate(args: argparse.Namespace) -> int:
    if args.data_dir is not None and args.input is not None:
        raise ValueError("--input: give DATA_DIR (with --split) or --input, not both")
    cfg = config_from_args(EvalConfig, args)
    translator = Translator.from_checkpoint(_checkpoint_paths(args), device=args.device, config=cfg)
    chunks, references = _translations(translator, args, cfg)
    best: list[str] = []
    num_sentences = num_tokens = 0
    started = time.perf_counter()
    with _open_output(args.output) as out:
        for chunk in chunks:
            for nbest in chunk:
                out.writelines(translation.text + "\n" for translation in nbest)
                num_sentences += 1
                num_tokens += len(nbest[0].tokens) + 1  # EOS counted, as fairseq-generate does
                if references is not None:  # only kept when scoring: plain translation streams
                    best.append(nbest[0].text)
    elapsed = time.perf_counter() - started
    scores = [] if references is None else translator.score(best, references, tokenized_lowercase=args.score_tokenized_lowercase)
    report = sys.stderr if args.output is None else sys.stdout
    print(
        f"translated {num_sentences} sentences ({num_tokens} tokens) in {elapsed:.1f}s: "
        f"{num_sentences / max(elapsed, 1e-9):.1f} sentences/s, {num_tokens / max(elapsed, 1e-9):.1f} tokens/s",
        file=sys.stderr,
    )
    for result in scores:
        print(result, file=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

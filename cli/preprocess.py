"""nmt-preprocess: train/apply SentencePiece, filter, binarize parallel text."""

from __future__ import annotations

import argparse
import logging
import sys

from nmt.config import PreprocessConfig
from nmt.data.preprocess import preprocess, summary_table


def _prefixes(values: list[str] | None) -> list[str]:
    """``--trainpref a,b --trainpref c`` -> [a, b, c]."""
    return [p for value in values or [] for p in value.split(",") if p]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmt-preprocess",
        description="Train or apply SentencePiece, filter and binarize parallel text into memory-mapped datasets.",
    )
    parser.add_argument("-s", "--source-lang", required=True)
    parser.add_argument("-t", "--target-lang", required=True)
    parser.add_argument("--trainpref", action="append", required=True, help="P reads P.SRC/P.TGT (or .gz); comma-separate or repeat for several corpora")
    parser.add_argument("--validpref", action="append", help="never filtered; comma-separate or repeat")
    parser.add_argument("--testpref", action="append", help="never filtered; comma-separate or repeat")
    parser.add_argument("--destdir", required=True)
    parser.add_argument("--spm-model", help="reuse this SentencePiece model instead of training one")
    parser.add_argument("--spm-vocab-size", type=int, default=8000)
    parser.add_argument("--spm-model-type", choices=("unigram", "bpe"), default="unigram")
    parser.add_argument("--separate-vocab", action="store_true", help="one SentencePiece model per language")
    parser.add_argument("--spm-character-coverage", type=float, default=1.0)
    parser.add_argument("--spm-sample-size", type=int, default=1_000_000, help="max sentences used to train SentencePiece")
    parser.add_argument("--max-len", type=int, default=256, help="drop training pairs with a side longer than this (tokens incl. EOS)")
    parser.add_argument("--min-len", type=int, default=1, help="drop training pairs with a side shorter than this (pieces)")
    parser.add_argument("--max-len-ratio", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=0, help="threads for SentencePiece (default: all cores); output is identical for any value")
    parser.add_argument("--skip-invalid", action="store_true", help="drop (train) or repair (valid/test) lines that are not UTF-8, and count them")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty --destdir")
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", stream=sys.stderr)
    try:
        cfg = PreprocessConfig(
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            destdir=args.destdir,
            trainpref=_prefixes(args.trainpref),
            validpref=_prefixes(args.validpref),
            testpref=_prefixes(args.testpref),
            spm_model=args.spm_model,
            spm_vocab_size=args.spm_vocab_size,
            spm_model_type=args.spm_model_type,
            separate_vocab=args.separate_vocab,
            spm_character_coverage=args.spm_character_coverage,
            spm_sample_size=args.spm_sample_size,
            max_len=args.max_len,
            min_len=args.min_len,
            max_len_ratio=args.max_len_ratio,
            workers=args.workers,
            skip_invalid=args.skip_invalid,
            overwrite=args.overwrite,
            seed=args.seed,
        )
        manifest, stats = preprocess(cfg)
    except ValueError as error:  # DataError included: one line naming the file or option
        print(f"nmt-preprocess: error: {error}", file=sys.stderr)
        return 1
    print(summary_table(stats))
    print(f"wrote {args.destdir} (vocab {manifest['spm']['src_vocab_size']}/{manifest['spm']['tgt_vocab_size']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

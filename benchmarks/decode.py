"""nmt-eval decoding speed on Multi30k test_2016_flickr: greedy and beam 5, batched vs one sentence at a time.

    python benchmarks/decode.py [--path runs/ckpt/checkpoint_best.pt] [--data runs/data] [--repeats 1]

Prints sentences/s and target tokens/s (EOS counted, as fairseq-generate counts) with BLEU for each
setting, side by side with ratios, and against the fairseq-generate reference measured on this
2-core machine. Decoding only is timed (the model is loaded and the sources read beforehand). Then
the cost of nmt-eval's fairseq-style extras (--format fairseq, --print-alignment, an ensemble of 2)
over the plain beam-5 decode.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from nmt.eval.translate import Translator, load_split, read_references

# Measured on this 2-core machine (issue 6): fairseq-generate, transformer of the same size, beam 5,
# batch 64, the 1,000 test2016 sentences. A reference figure, not re-run here (fairseq is not a dependency).
FAIRSEQ_BEAM5_SENTENCES_PER_S = 48.0
FAIRSEQ_BEAM5_TOKENS_PER_S = 780.0


def run(translator: Translator, sources: list, references: list[str], *, beam: int, batch_size: int, repeats: int) -> dict[str, float]:
    """Best of ``repeats`` timed decodes (the first warms up allocator and kernels when repeats > 1)."""
    elapsed = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        hypotheses = translator.generate(sources, beam=beam, batch_size=batch_size)
        elapsed = min(elapsed, time.perf_counter() - started)
    num_tokens = sum(len(nbest[0].tokens) + 1 for nbest in hypotheses)
    texts = [nbest[0].text for nbest in translator.detokenize(hypotheses)]
    bleu = translator.score(texts, references[: len(texts)])[0].score
    return {"seconds": elapsed, "sentences/s": len(sources) / elapsed, "tokens/s": num_tokens / elapsed, "bleu": bleu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="runs/ckpt/checkpoint_best.pt")
    parser.add_argument("--data", default="runs/data")
    parser.add_argument("--split", default="test")
    parser.add_argument("--reference", help="raw reference text (default: the one the manifest names)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--limit", type=int, help="only the first N sentences (quick runs; figures are then not the reference's)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    translator = Translator.from_checkpoint(args.path)
    split = load_split(args.data, args.split, src_spm=translator.src_spm)
    reference_path = args.reference or split.reference_path
    if reference_path is None:
        parser.error(f"the manifest of {args.data} names no raw reference text; pass --reference")
    references = read_references(reference_path, line_numbers=split.line_numbers)
    sources = split.sources[: args.limit]
    num_params = sum(p.numel() for p in translator.model.parameters())
    print(
        f"\n{args.split}: {len(sources)} sentences | model {num_params / 1e6:.2f}M parameters ({args.path}) | "
        f"cpu, {torch.get_num_threads()} threads | best of {args.repeats}"
    )
    # Figures from a busy machine are not comparable: say how busy it was.
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"{'search':>7}  {'batch':>5}  {'seconds':>8}  {'sent/s':>8}  {'tokens/s':>9}  {'BLEU':>6}  {'batched vs 1':>12}")
    results = {}
    for beam in (1, 5):
        for batch_size in (args.batch_size, 1):
            results[beam, batch_size] = run(translator, sources, references, beam=beam, batch_size=batch_size, repeats=args.repeats)
        for batch_size in (args.batch_size, 1):
            r = results[beam, batch_size]
            ratio = r["sentences/s"] / results[beam, 1]["sentences/s"]
            name = "greedy" if beam == 1 else f"beam {beam}"
            print(
                f"{name:>7}  {batch_size:>5}  {r['seconds']:>8.2f}  {r['sentences/s']:>8.1f}  {r['tokens/s']:>9.0f}  "
                f"{r['bleu']:>6.2f}  {ratio:>11.2f}x"
            )
    beam5 = results[5, args.batch_size]
    print(
        f"fairseq-generate reference (beam 5, batch 64): {FAIRSEQ_BEAM5_SENTENCES_PER_S:.0f} sentences/s, "
        f"{FAIRSEQ_BEAM5_TOKENS_PER_S:.0f} tokens/s -> ours {beam5['sentences/s'] / FAIRSEQ_BEAM5_SENTENCES_PER_S:.2f}x "
        f"sentences/s, {beam5['tokens/s'] / FAIRSEQ_BEAM5_TOKENS_PER_S:.2f}x tokens/s (target: 2x)"
    )
    print_extras(args, translator, sources, beam5)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def print_extras(args: argparse.Namespace, translator: Translator, sources: list, plain: dict[str, float]) -> None:
    """What nmt-eval's fairseq-style options cost over a plain beam-5 decode, in the same run:
    --format fairseq (per-token scores by forced decoding), --print-alignment, a 2-model ensemble
    (the checkpoint twice: the cost of a second model, whatever its weights)."""
    ensemble = Translator.from_checkpoint([args.path, args.path])

    def fairseq_lines(alignment: bool) -> None:
        nbest = translator.detokenize(translator.generate(sources, beam=5, batch_size=args.batch_size))
        translator.add_token_scores(sources, nbest, alignment=alignment)

    cases = {
        "--format fairseq": lambda: fairseq_lines(False),
        "+ --print-alignment": lambda: fairseq_lines(True),
        "ensemble of 2": lambda: ensemble.generate(sources, beam=5, batch_size=args.batch_size),
    }
    print(f"\nbeam 5, batch {args.batch_size}: plain {plain['seconds']:.2f} s")
    for name, work in cases.items():
        elapsed = float("inf")
        for _ in range(args.repeats):
            started = time.perf_counter()
            work()
            elapsed = min(elapsed, time.perf_counter() - started)
        print(f"{name:>20}  {elapsed:>8.2f} s  {elapsed / plain['seconds']:>5.2f}x the plain decode")


if __name__ == "__main__":
    main()

"""nmt-eval decoding speed on Multi30k test_2016_flickr: greedy and beam 5, batched vs one sentence at a time;
then PyTorch vs CTranslate2 float32 vs CTranslate2 int8, each as a whole nmt-eval process.

    python benchmarks/decode.py [--path runs/ckpt/checkpoint_best.pt] [--data runs/data] [--repeats 1]
        [--ct2-dir runs/ct2] [--int8-dir runs/ct2-int8] [--skip-in-process] [--skip-backends]

The first table prints sentences/s and target tokens/s (EOS counted, as fairseq-generate counts) with
BLEU for each setting, side by side with ratios; decoding only is timed (the model is loaded and the
sources read beforehand).
Then the cost of nmt-eval's fairseq-style extras (--format fairseq, --print-alignment, an ensemble of
2) over the plain beam-5 decode.

The last runs ``nmt-eval DATA --path P --split test --beam 5`` once per backend, in a fresh process
each (the exports are made first when their directories do not exist): model size on disk, the whole
process's wall time, CPU time (all its threads) and peak resident memory, the decode's sentences/s and tokens/s (as nmt-eval
reports them), BLEU, and how many hypotheses are identical to PyTorch's; ratios against PyTorch.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

from nmt.checkpoint_io import load_checkpoint
from nmt.eval.translate import Translator, load_split, read_references
from nmt.results import write_results


def run(
    translator: Translator,
    sources: list,
    references: list[str],
    *,
    beam: int,
    batch_size: int,
    repeats: int,
) -> dict[str, float]:
    """Best of ``repeats`` timed decodes (the first warms up allocator and kernels when repeats > 1)."""
    elapsed = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        hypotheses = translator.generate(sources, beam=beam, batch_size=batch_size)
        elapsed = min(elapsed, time.perf_counter() - started)
    num_tokens = sum(len(nbest[0].tokens) + 1 for nbest in hypotheses)
    texts = [nbest[0].text for nbest in translator.detokenize(hypotheses)]
    bleu = translator.score(texts, references[: len(texts)])[0].score
    return {
        "seconds": elapsed,
        "sentences/s": len(sources) / elapsed,
        "tokens/s": num_tokens / elapsed,
        "bleu": bleu,
    }


def weights_mib(path: str) -> float:
    """Bytes of the model's own tensors in a checkpoint (a training checkpoint also holds the optimizer);
    shared embeddings are one tensor under several names, counted once."""
    tensors = {t.data_ptr(): t for t in load_checkpoint(path)["model"].values()}
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20


def disk_mib(path: str) -> float:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path)) / 2**20
    return os.path.getsize(path) / 2**20


def run_process(
    path: str,
    data: str,
    split: str,
    output: str,
    *,
    beam: int,
    batch_size: int,
    threads: int | None,
) -> dict[str, float]:
    """One ``nmt-eval`` process: wall and CPU time, peak resident memory (of that child alone), its
    figures, BLEU."""
    command = [
        sys.executable,
        "-m",
        "nmt_cli.eval",
        data,
        "--path",
        path,
        "--split",
        split,
        "--beam",
        str(beam),
        "--batch-size",
        str(batch_size),
        "--output",
        output,
    ]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        # OMP_NUM_THREADS sets torch's intra-op threads and CTranslate2's (it reads it when not told).
        env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, env=env)
        _, status, usage = os.wait4(
            process.pid, 0
        )  # reaped here: wait4 gives this child's own peak RSS
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read(), stderr.read()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{err}")
    decode = re.search(r"in ([\d.]+)s: ([\d.]+) sentences/s, ([\d.]+) tokens/s", err)
    bleu = re.search(r"BLEU = ([\d.]+)", out)
    return {
        "wall": wall,
        # On shared cores the wall clock measures the other jobs too; the CPU seconds much less so.
        "cpu": usage.ru_utime + usage.ru_stime,
        "decode": float(decode.group(1)),
        "sentences/s": float(decode.group(2)),
        "tokens/s": float(decode.group(3)),
        "bleu": float(bleu.group(1)),
        "peak_mib": usage.ru_maxrss / 1024,  # kilobytes on Linux
    }


def compare_backends(args: argparse.Namespace) -> list[list[str]]:
    """PyTorch checkpoint vs its CTranslate2 exports, each decoded by a fresh nmt-eval process."""
    from nmt.deploy.ct2 import export_ctranslate2

    for directory, quantization in ((args.ct2_dir, None), (args.int8_dir, "int8")):
        if not os.path.exists(os.path.join(directory, "nmt_export.json")):
            export_ctranslate2([args.path], directory, quantization=quantization, force=True)
    backends = (("torch", args.path), ("ct2 float32", args.ct2_dir), ("ct2 int8", args.int8_dir))
    threads = (
        f"OMP_NUM_THREADS={args.process_threads}" if args.process_threads else "default threads"
    )
    print(
        f"\nbackends: nmt-eval {args.data} --split {args.split} --beam 5 --batch-size {args.batch_size}, one process each, "
        f"{threads}, best of {args.repeats} rounds (each round runs the three in turn)"
    )
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    results: dict[str, dict[str, float]] = {}
    hypotheses = {}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(
            args.repeats
        ):  # the machine is shared: the fastest round of each is its own speed
            for name, path in backends:
                output = os.path.join(scratch, name.replace(" ", "-") + ".hyp")
                result = run_process(
                    path,
                    args.data,
                    args.split,
                    output,
                    beam=5,
                    batch_size=args.batch_size,
                    threads=args.process_threads,
                )
                if name not in results or result["wall"] < results[name]["wall"]:
                    results[name] = result
                with open(output, encoding="utf-8") as handle:
                    hypotheses[name] = handle.read().split("\n")[:-1]
    reference = results["torch"]
    print(
        f"{'backend':>12}  {'size MiB':>8}  {'process s':>9}  {'CPU s':>9}  {'decode s':>8}  {'sent/s':>7}  {'tokens/s':>8}  "
        f"{'peak MiB':>8}  {'BLEU':>6}  {'= torch':>7}  {'process x':>9}  {'CPU x':>9}  {'decode x':>8}"
    )
    rows = []
    for name, path in backends:
        r = results[name]
        same = sum(a == b for a, b in zip(hypotheses[name], hypotheses["torch"]))
        size = weights_mib(path) if name == "torch" else disk_mib(path)
        print(
            f"{name:>12}  {size:>8.1f}  {r['wall']:>9.2f}  {r['cpu']:>9.2f}  {r['decode']:>8.2f}  {r['sentences/s']:>7.1f}  {r['tokens/s']:>8.0f}  "
            f"{r['peak_mib']:>8.0f}  {r['bleu']:>6.2f}  {100 * same / len(hypotheses['torch']):>6.1f}%  "
            f"{reference['wall'] / r['wall']:>8.2f}x  {reference['cpu'] / r['cpu']:>8.2f}x  "
            f"{r['sentences/s'] / reference['sentences/s']:>7.2f}x"
        )
        rows.append(
            [
                name,
                f"{size:.1f}",
                f"{r['wall']:.2f}",
                f"{r['cpu']:.2f}",
                f"{r['decode']:.2f}",
                f"{r['sentences/s']:.1f}",
            ]
            + [f"{r['tokens/s']:.0f}", f"{r['peak_mib']:.0f}", f"{r['bleu']:.2f}"]
            + [
                f"{100 * same / len(hypotheses['torch']):.1f}%",
                f"{reference['wall'] / r['wall']:.2f}x",
                f"{reference['cpu'] / r['cpu']:.2f}x",
            ]
            + [f"{r['sentences/s'] / reference['sentences/s']:.2f}x"]
        )
    print(
        f"(torch size: the model's tensors; its training checkpoint file is {disk_mib(args.path):.1f} MiB with the "
        f"optimizer state. Targets: float32 >= 90% identical, BLEU within 0.5; int8 within 1.0 BLEU, >= 2x process)"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


def compare_search(args: argparse.Namespace) -> list[list[str]]:
    """PyTorch, in this process: greedy and beam 5, batched vs one sentence at a time."""
    translator = Translator.from_checkpoint(args.path)
    split = load_split(args.data, args.split, src_spm=translator.src_spm)
    reference_path = args.reference or split.reference_path
    if reference_path is None:
        raise SystemExit(
            f"the manifest of {args.data} names no raw reference text; pass --reference"
        )
    references = read_references(reference_path, line_numbers=split.line_numbers)
    sources = split.sources[: args.limit]
    num_params = sum(p.numel() for p in translator.model.parameters())
    print(
        f"\n{args.split}: {len(sources)} sentences | model {num_params / 1e6:.2f}M parameters ({args.path}) | "
        f"cpu, {torch.get_num_threads()} threads | best of {args.repeats}"
    )
    # Figures from a busy machine are not comparable: say how busy it was.
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(
        f"{'search':>7}  {'batch':>5}  {'seconds':>8}  {'sent/s':>8}  {'tokens/s':>9}  {'BLEU':>6}  {'batched vs 1':>12}"
    )
    results = {}
    rows = []
    for beam in (1, 5):
        for batch_size in (args.batch_size, 1):
            results[beam, batch_size] = run(
                translator,
                sources,
                references,
                beam=beam,
                batch_size=batch_size,
                repeats=args.repeats,
            )
        for batch_size in (args.batch_size, 1):
            r = results[beam, batch_size]
            ratio = r["sentences/s"] / results[beam, 1]["sentences/s"]
            name = "greedy" if beam == 1 else f"beam {beam}"
            print(
                f"{name:>7}  {batch_size:>5}  {r['seconds']:>8.2f}  {r['sentences/s']:>8.1f}  {r['tokens/s']:>9.0f}  "
                f"{r['bleu']:>6.2f}  {ratio:>11.2f}x"
            )
            rows.append(
                [name, str(batch_size), f"{r['seconds']:.2f}", f"{r['sentences/s']:.1f}"]
                + [f"{r['tokens/s']:.0f}", f"{r['bleu']:.2f}", f"{ratio:.2f}x"]
            )
    print_extras(args, translator, sources, results[5, args.batch_size])
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", default="runs/ckpt/checkpoint_best.pt")
    parser.add_argument("--data", default="runs/data")
    parser.add_argument("--split", default="test")
    parser.add_argument(
        "--reference", help="raw reference text (default: the one the manifest names)"
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed decodes in process, or rounds of processes (best of)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        help="only the first N sentences (quick runs; figures are then not the reference's)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch intra-op threads in this process (default: torch's, one per core)",
    )
    parser.add_argument(
        "--ct2-dir", default="runs/ct2", help="float32 export of --path (made when missing)"
    )
    parser.add_argument(
        "--int8-dir", default="runs/ct2-int8", help="int8 export of --path (made when missing)"
    )
    parser.add_argument(
        "--process-threads",
        type=int,
        help="compute threads of each nmt-eval process (default: each backend's own)",
    )
    parser.add_argument("--skip-in-process", action="store_true", help="only the backends table")
    parser.add_argument(
        "--skip-backends", action="store_true", help="only the in-process search table"
    )
    parser.add_argument("--results", help="also write the tables as a results file (nmt.results)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tables = {}
    if not args.skip_in_process:
        columns = ["search", "batch", "seconds", "sent/s", "tokens/s", "BLEU", "batched vs 1"]
        tables["search"] = {"columns": columns, "rows": compare_search(args)}
    if not args.skip_backends:
        columns = ["backend", "size MiB", "process s", "CPU s", "decode s", "sent/s", "tokens/s"]
        columns += ["peak MiB", "BLEU", "= torch", "process x", "CPU x", "decode x"]
        tables["backends"] = {"columns": columns, "rows": compare_backends(args)}
    if args.results:
        # One table per results file is published: the in-process search's when it ran.
        write_results(args.results, figures={"table": next(iter(tables.values())), **tables})


def print_extras(
    args: argparse.Namespace, translator: Translator, sources: list, plain: dict[str, float]
) -> None:
    """What nmt-eval's fairseq-style options cost over a plain beam-5 decode, in the same run:
    --format fairseq (per-token scores by forced decoding), --print-alignment, a 2-model ensemble
    (the checkpoint twice: the cost of a second model, whatever its weights)."""
    ensemble = Translator.from_checkpoint([args.path, args.path])

    def fairseq_lines(alignment: bool) -> None:
        nbest = translator.detokenize(
            translator.generate(sources, beam=5, batch_size=args.batch_size)
        )
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
        print(
            f"{name:>20}  {elapsed:>8.2f} s  {elapsed / plain['seconds']:>5.2f}x the plain decode"
        )


if __name__ == "__main__":
    main()

"""nmt-preprocess at scale: pairs/s and peak memory (summed PSS of all processes), side by side.

    python benchmarks/preprocess.py --pairs 10M [--workdir /tmp/nmt-bench] [--steps given,threads,dedup,train-gz,sharded,sharded-merged,in-memory]

Builds a synthetic corpus from the bundled Multi30k (training pairs joined 1-3 at a time, both sides
alike, so it stays parallel) once under --workdir and reuses it. Then runs `nmt-preprocess` as a
subprocess, sampling the PSS of it and its worker processes every 0.5 s:

- given:     --pairs pairs, plain text, SentencePiece model given, --workers worker processes
- threads:   the same with --encoder threads (SentencePiece's own threads in one process: the other mode)
- dedup:     the same as given, with --dedup (a third of the synthetic lines are single Multi30k pairs:
             most of those repeat)
- train-gz:  --gz-pairs pairs (default 1M), gzip text, SentencePiece trained (reservoir sample)
- sharded:   the `given` corpus in --shards parts under torchrun (one rank per part), as the 1B plan runs it
- sharded-merged: the same with --merge-parts: the simplest sharded version's output (the parts
             concatenated into one file per split and side, training never sees parts)
- in-memory: what nmt-preprocess did before streaming (as in the issue): every line read and encoded
             into Python lists before writing (on --in-memory-pairs pairs; its memory grows with them)

The dataset written by the `given` step stays at WORKDIR/data-given (lead: the 10M training
start-up benchmark can open it; `--keep` keeps it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

from nmt.results import write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI30K = os.path.join(ROOT, "data", "multi30k")


def parse_count(text: str) -> int:
    scale = {"k": 1_000, "m": 1_000_000, "b": 1_000_000_000}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def multi30k_lines(lang: str) -> list[bytes]:
    with gzip.open(os.path.join(MULTI30K, f"train.{lang}.gz"), "rb") as handle:
        return handle.read().split(b"\n")[:-1]


def build_corpus(prefix: str, num_pairs: int, *, compress: bool, seed: int = 0) -> None:
    """``prefix.en``/``prefix.de`` (``.gz``): each line joins 1-3 random Multi30k training pairs."""
    suffix = ".gz" if compress else ""
    if all(os.path.exists(f"{prefix}.{lang}{suffix}") for lang in ("en", "de")):
        return
    src, tgt = multi30k_lines("en"), multi30k_lines("de")
    rng = np.random.default_rng(seed)
    opener = (
        (lambda path: gzip.open(path, "wb", compresslevel=6))
        if compress
        else (lambda path: open(path, "wb"))
    )
    started = time.perf_counter()
    with (
        opener(f"{prefix}.en{suffix}.tmp") as out_src,
        opener(f"{prefix}.de{suffix}.tmp") as out_tgt,
    ):
        for start in range(0, num_pairs, 100_000):
            count = min(100_000, num_pairs - start)
            sizes = rng.integers(1, 4, size=count)
            picks = rng.integers(0, len(src), size=int(sizes.sum())).tolist()
            bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
            for lines, out in ((src, out_src), (tgt, out_tgt)):
                out.write(
                    b"".join(
                        b" ".join(lines[p] for p in picks[a:b]) + b"\n"
                        for a, b in zip(bounds, bounds[1:])
                    )
                )
    for lang in ("en", "de"):
        os.replace(f"{prefix}.{lang}{suffix}.tmp", f"{prefix}.{lang}{suffix}")
    print(
        f"built {num_pairs:,} pairs at {prefix}.*{suffix} in {time.perf_counter() - started:.0f} s",
        flush=True,
    )


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc/PID/task/TID/children (no scan of every process)."""
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        found.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    frontier += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_measured(
    command: list[str], *, env: dict[str, str] | None = None
) -> tuple[float, float, float, str]:
    """(seconds, CPU seconds, peak summed PSS in GB, stderr) of a command and all its descendants.

    CPU seconds (user + system of the whole tree) do not depend on what else the machine runs:
    pairs / CPU seconds x cores is the rate the same work reaches on otherwise idle cores."""
    peak = 0
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.5):
            peak = max(peak, sum(_pss_kb(pid) for pid in _tree(process.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    if process.returncode != 0:
        sys.exit(f"failed ({process.returncode}): {' '.join(command)}\n{stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, peak * 1024 / 1e9, stderr


def preprocess_command(prefix: str, destdir: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "nmt_cli.preprocess",
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        prefix,
        "--destdir",
        destdir,
        "--overwrite",
        *extra,
    ]


IN_MEMORY = r"""
import sys, time, numpy as np
from nmt.data.spm import SentencePieceModel
from nmt.data.indexed import IndexedWriter
prefix, model_path, out = sys.argv[1:4]
model = SentencePieceModel.load(model_path)
for lang in ("en", "de"):
    with open(f"{prefix}.{lang}", "rb") as handle:
        lines = handle.read().decode("utf-8").split("\n")[:-1]   # every line in memory
    ids = model.processor.encode(lines, out_type=int, add_eos=True, num_threads=2)  # every sentence as a list of ints
    lengths = np.array([len(seq) for seq in ids])
    tokens = np.array([token for seq in ids for token in seq], dtype=np.uint16)
    writer = IndexedWriter(f"{out}.{lang}", dtype=np.dtype(np.uint16))
    writer.add_many(tokens, lengths)
    writer.finish()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=parse_count, default=parse_count("10M"))
    parser.add_argument("--gz-pairs", type=parse_count, default=parse_count("1M"))
    parser.add_argument("--in-memory-pairs", type=parse_count, default=parse_count("1M"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/nmt-bench")
    parser.add_argument(
        "--steps", default="given,threads,dedup,train-gz,sharded,sharded-merged,in-memory"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the datasets (data-given is kept always)"
    )
    parser.add_argument("--results", help="also write the table as a results file (nmt.results)")
    args = parser.parse_args()
    steps = args.steps.split(",")
    os.makedirs(args.workdir, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    rows: list[tuple[str, int, float, float, float]] = []

    # A SentencePiece model trained on Multi30k itself (the "given" model).
    model_dir = os.path.join(args.workdir, "spm-multi30k")
    if not os.path.exists(os.path.join(model_dir, "spm.model")):
        subprocess.run(
            preprocess_command(os.path.join(MULTI30K, "train"), model_dir),
            check=True,
            env=env,
            capture_output=True,
        )
    spm_model = os.path.join(model_dir, "spm.model")

    plain = os.path.join(args.workdir, f"synthetic-{args.pairs}")
    if {"given", "threads", "dedup", "sharded"} & set(steps):
        build_corpus(plain, args.pairs, compress=False)
    if "given" in steps:
        seconds, cpu, peak, _ = run_measured(
            preprocess_command(
                plain,
                os.path.join(args.workdir, "data-given"),
                "--spm-model",
                spm_model,
                "--workers",
                str(args.workers),
            ),
            env=env,
        )
        rows.append(
            (
                f"given model, plain text, {args.workers} worker processes",
                args.pairs,
                seconds,
                cpu,
                peak,
            )
        )
    if "threads" in steps:
        destdir = os.path.join(args.workdir, "data-threads")
        seconds, cpu, peak, _ = run_measured(
            preprocess_command(
                plain,
                destdir,
                "--spm-model",
                spm_model,
                "--workers",
                str(args.workers),
                "--encoder",
                "threads",
            ),
            env=env,
        )
        rows.append(
            (
                f"given model, plain text, 1 process x {args.workers} SentencePiece threads (--encoder threads)",
                args.pairs,
                seconds,
                cpu,
                peak,
            )
        )
        if not args.keep:
            shutil.rmtree(destdir, ignore_errors=True)
    if "dedup" in steps:
        destdir = os.path.join(args.workdir, "data-dedup")
        seconds, cpu, peak, _ = run_measured(
            preprocess_command(
                plain, destdir, "--spm-model", spm_model, "--workers", str(args.workers), "--dedup"
            ),
            env=env,
        )
        with open(os.path.join(destdir, "manifest.json")) as handle:
            duplicates = json.load(handle)["splits"]["train"]["filtered"]["duplicate"]
        rows.append(
            (
                f"given model, plain text, {args.workers} worker processes, --dedup ({duplicates:,} dropped)",
                args.pairs,
                seconds,
                cpu,
                peak,
            )
        )
        if not args.keep:
            shutil.rmtree(destdir, ignore_errors=True)
    for step, extra, what in (
        ("sharded", [], "parts, read as one corpus"),
        ("sharded-merged", ["--merge-parts"], "parts concatenated by the last rank"),
    ):
        if step not in steps:
            continue
        destdir = os.path.join(args.workdir, "data-sharded")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(args.shards),
            "-m",
            *preprocess_command(plain, destdir, "--spm-model", spm_model, "--workers", "1")[2:],
            *extra,
        ]
        seconds, cpu, peak, _ = run_measured(command, env={**env, "OMP_NUM_THREADS": "1"})
        rows.append(
            (
                f"given model, plain text, torchrun {args.shards} ranks x 1 process ({what})",
                args.pairs,
                seconds,
                cpu,
                peak,
            )
        )
        shutil.rmtree(destdir, ignore_errors=True)
    if "train-gz" in steps:
        gz = os.path.join(args.workdir, f"synthetic-{args.gz_pairs}-gz")
        build_corpus(gz, args.gz_pairs, compress=True, seed=1)
        destdir = os.path.join(args.workdir, "data-train-gz")
        seconds, cpu, peak, stderr = run_measured(
            preprocess_command(gz, destdir, "--workers", str(args.workers)), env=env
        )
        trained = [
            line.split("| ")[-1] for line in stderr.splitlines() if "trained SentencePiece" in line
        ]
        rows.append(
            (
                f"SentencePiece trained (default sample), gzip text, {args.workers} workers",
                args.gz_pairs,
                seconds,
                cpu,
                peak,
            )
        )
        print(*trained, sep="\n")
        if not args.keep:
            shutil.rmtree(destdir, ignore_errors=True)
    if "in-memory" in steps:
        small = os.path.join(args.workdir, f"synthetic-{args.in_memory_pairs}")
        build_corpus(small, args.in_memory_pairs, compress=False)
        out = os.path.join(args.workdir, "in-memory")
        seconds, cpu, peak, _ = run_measured(
            [sys.executable, "-c", IN_MEMORY, small, spm_model, out], env=env
        )
        rows.append(
            (
                "in memory (nmt-preprocess before streaming), 2 threads",
                args.in_memory_pairs,
                seconds,
                cpu,
                peak,
            )
        )
        for lang in ("en", "de"):
            for ext in (".bin", ".idx"):
                os.remove(f"{out}.{lang}{ext}")

    load = os.getloadavg()
    print(
        f"\nnmt-preprocess at scale (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} cores)"
    )
    cores = os.cpu_count() or 1
    print(
        f"{'step':<78} {'pairs':>12} {'seconds':>8} {'pairs/s':>9} {'CPU s':>8} {'pairs/CPU-s':>11} {'peak PSS':>9}"
    )
    for name, pairs, seconds, cpu, peak in rows:
        print(
            f"{name:<78} {pairs:>12,} {seconds:>8.1f} {pairs / seconds:>9,.0f} {cpu:>8.1f} {pairs / cpu:>11,.0f} {peak:>7.2f} GB"
        )
    print(f"(pairs/CPU-s x {cores} cores bounds the wall-clock rate on otherwise idle cores)")
    rates = {name: pairs / seconds for name, pairs, seconds, _, _ in rows}
    processes = [rate for name, rate in rates.items() if name.endswith("worker processes")]
    threads = [rate for name, rate in rates.items() if "--encoder threads" in name]
    figures: dict = {"load": [round(x, 2) for x in load]}
    if processes and threads:
        figures["processes_vs_threads"] = round(processes[0] / threads[0], 2)
        print(
            f"worker processes vs SentencePiece threads, wall clock: {processes[0] / threads[0]:.2f}x pairs/s"
        )
    cpus = {name: cpu for name, _, _, cpu, _ in rows}
    parts = [name for name in rates if name.endswith("(parts, read as one corpus)")]
    merged = [name for name in rates if name.endswith("(parts concatenated by the last rank)")]
    for other in [name for name in rates if name.endswith("worker processes")] + merged:
        for name in parts:
            print(
                f"sharded parts vs {other}: {rates[name] / rates[other]:.2f}x pairs/s, "
                f"{cpus[other] / cpus[name]:.2f}x fewer CPU-s"
            )
    if args.results:
        figures["table"] = {
            "columns": ["step", "pairs", "seconds", "pairs/s", "CPU s", "pairs/CPU-s", "peak PSS"],
            "rows": [
                [name, f"{pairs:,}", f"{seconds:.1f}", f"{pairs / seconds:,.0f}", f"{cpu:.1f}"]
                + [f"{pairs / cpu:,.0f}", f"{peak:.2f} GB"]
                for name, pairs, seconds, cpu, peak in rows
            ],
        }
        write_results(args.results, figures=figures)


if __name__ == "__main__":
    main()

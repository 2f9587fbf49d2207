"""Many directions, one model: time from `nmt-train` start to its first update, and peak memory,
for 10, 30 and 100 synthetic directions, side by side.

The directions are synthetic: Multi30k's four training languages (29,000 lines each) copied under
local-use language codes (qaa, qab, ...: ISO 639's reserved range), multi-way, so D directions over L
codes are L language files encoded once and D direction splits pointing at them (fairseq builds,
filters and batches every pair apart: its start-up grows with the pairs, issue #2410). Each case
preprocesses its dataset (not timed), then runs `nmt-train --max-update 1` in a fresh process (no
validation split: the first update is what is measured) and reports

- seconds from the process start to the end of the first update (the log's first training record),
- peak RSS of that process, and the bytes the per-sample length arrays account for (the blend's
  slots and the per-direction lengths: they grow with the samples, which grow with the directions;
  the rest should not).

    .venv/bin/python benchmarks/multilingual_scale.py                  # 10, 30, 100 directions
    .venv/bin/python benchmarks/multilingual_scale.py --directions 100 --lines 5000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

from nmt.results import write_results

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REAL = ("en", "de", "fr", "cs")


def codes(count: int) -> list[str]:
    return [
        f"qa{chr(ord('a') + i)}" if i < 26 else f"qb{chr(ord('a') + i - 26)}" for i in range(count)
    ]


def pairs_for(num_directions: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The fewest synthetic languages with at least ``num_directions`` ordered pairs, and the pairs."""
    languages = 2
    while languages * (languages - 1) < num_directions:
        languages += 1
    names = codes(languages)
    pairs = [(a, b) for a in names for b in names if a != b][:num_directions]
    return names, pairs


def write_languages(directory: str, names: list[str], lines: int) -> None:
    for index, name in enumerate(names):
        real = REAL[index % len(REAL)]
        with gzip.open(os.path.join(ROOT, "data", "multi30k", f"train.{real}.gz"), "rb") as source:
            text = source.read().split(b"\n")[:lines]
        with open(os.path.join(directory, f"train.{name}"), "wb") as out:
            out.write(b"\n".join(text) + b"\n")


def run_case(num_directions: int, *, lines: int, workdir: str, python: str) -> dict[str, float]:
    names, pairs = pairs_for(num_directions)
    raw = os.path.join(workdir, f"raw-{num_directions}")
    os.makedirs(raw)
    write_languages(raw, names, lines)
    data = os.path.join(workdir, f"data-{num_directions}")
    subprocess.run(
        [
            python, "-m", "nmt_cli.preprocess",
            "--lang-pairs", ",".join(f"{a}-{b}" for a, b in pairs),
            "--trainpref", os.path.join(raw, "train"),
            "--destdir", data,
            "--spm-sample-size", "50000",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # A wrapper process runs nmt-train as its only child and reports the child's peak RSS.
    wrapper = (
        "import resource, subprocess, sys, time\n"
        "started = time.time()\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(started)\n"
        "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
        "print(usage.ru_maxrss)\n"
        "print(usage.ru_utime + usage.ru_stime)\n"
        "print(done.returncode)\n"
        "sys.stderr.write(done.stdout + done.stderr)\n"
    )
    command = [
        python, "-m", "nmt_cli.train", data,
        "--save-dir", os.path.join(workdir, f"ckpt-{num_directions}"),
        "--max-update", "1", "--max-tokens", "4096", "--sampling-temperature", "5",
        "--log-format", "json", "--log-interval", "1", "--no-progress-bar", "--no-epoch-checkpoints",
    ]  # fmt: skip
    result = subprocess.run(
        [python, "-c", wrapper, *command], capture_output=True, text=True, check=True
    )
    started, peak_kib, cpu_seconds, returncode = result.stdout.split()
    if int(returncode) != 0:
        raise SystemExit(
            f"nmt-train failed for {num_directions} directions:\n{result.stderr[-3000:]}"
        )
    first = next(
        json.loads(line)
        for line in result.stderr.splitlines()
        if line.startswith("{") and '"kind": "train"' in line
    )
    num_samples = num_directions * lines
    # Per sample: the blend's corpus (2 B) and sample (4 B) ids, its source and target lengths in the
    # blend (2 x 8 B) and the concatenations they are gathered from (2 x 8 B), each direction's tagged
    # lengths (2 x 8 B), the batcher's sort keys and order (~3 x 8 B).
    length_bytes = num_samples * (2 + 4 + 16 + 16 + 16 + 24)
    return {
        "directions": num_directions,
        "languages": len(names),
        "samples": num_samples,
        "first_update_s": first["time"] - float(started),
        # The whole run's CPU (the update, then saving): shared cores slow the wall clock, not this.
        "cpu_s": float(cpu_seconds),
        "peak_rss_mb": int(peak_kib) / 1024,
        "length_arrays_mb": length_bytes / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--directions", default="10,30,100", help="comma-separated counts")
    parser.add_argument("--lines", type=int, default=29_000, help="lines per language (<= 29,000)")
    parser.add_argument("--results", help="also write the table as a results file (nmt.results)")
    args = parser.parse_args()
    counts = [int(count) for count in args.directions.split(",")]
    # Warm the page cache with torch's and nmt's imports: the first case must not pay for a cold disk.
    subprocess.run(
        [sys.executable, "-m", "nmt_cli.train", "--help"], check=True, capture_output=True
    )
    with tempfile.TemporaryDirectory(prefix="nmt-multi-scale-") as workdir:
        rows = []
        for count in counts:
            started = time.perf_counter()
            rows.append(run_case(count, lines=args.lines, workdir=workdir, python=sys.executable))
            print(
                f"{count} directions measured ({time.perf_counter() - started:.0f} s with preprocessing)",
                file=sys.stderr,
            )
    base = rows[0]
    print(
        "| directions | languages | samples | start -> first update (s) | CPU s | peak RSS (MB) | "
        "length arrays (MB) | RSS - length arrays (MB) | vs first row |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    table = []
    for row in rows:
        rest = row["peak_rss_mb"] - row["length_arrays_mb"]
        base_rest = base["peak_rss_mb"] - base["length_arrays_mb"]
        table.append(
            [row["directions"], row["languages"], f"{row['samples']:,}"]
            + [f"{row['first_update_s']:.1f}", f"{row['cpu_s']:.1f}", f"{row['peak_rss_mb']:.0f}"]
            + [f"{row['length_arrays_mb']:.0f}", f"{rest:.0f}", f"{rest / base_rest:.2f}x"]
        )
        print("| " + " | ".join(map(str, table[-1])) + " |")
    if args.results:
        columns = ["directions", "languages", "samples", "start -> first update (s)", "CPU s"]
        columns += ["peak RSS (MB)", "length arrays (MB)", "RSS - length arrays (MB)"]
        write_results(
            args.results,
            figures={
                "cases": rows,
                "table": {"columns": columns + ["vs first row"], "rows": table},
            },
        )


if __name__ == "__main__":
    main()

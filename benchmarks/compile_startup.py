"""nmt-train --compile: seconds to the 1st and the 3rd update, recompiles, tokens/s, before and after.

    python benchmarks/compile_startup.py --baseline-tree OLD_CHECKOUT [--updates 10] [--repeats 1]

The default model (nmt-train's defaults: transformer_tiny, packed, --max-tokens 2048) on the bundled
Multi30k, each row a whole nmt-train process from its start (imports included), the rows taking
turns in every round: this tree's --compile with an empty compile cache, the same again with the
cache that run left (a restart or a resume), the baseline tree's --compile (an empty cache), and this tree
without --compile. Tokens/s count the updates after the 3rd. Prints the load average beside each
round: on a shared machine compile times follow the load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from train_throughput import DATA, ensure_data  # noqa: E402  (one Multi30k dataset for both)

# A tree's nmt and nmt_cli (its cli/ directory made the package, as the installed one is), so an
# older checkout runs in the same benchmark as this one; the trainer's figures are printed as JSON.
CHILD = """
import importlib.util, json, sys
tree, data, save_dir, *extra = sys.argv[1:]
sys.path.insert(0, tree)
spec = importlib.util.spec_from_file_location(
    "nmt_cli", tree + "/cli/__init__.py", submodule_search_locations=[tree + "/cli"]
)
cli = importlib.util.module_from_spec(spec)
sys.modules["nmt_cli"] = cli
spec.loader.exec_module(cli)
from nmt.data import load_manifest
from nmt.train.trainer import Trainer
from nmt_cli.train import build_parser, make_configs

manifest = load_manifest(data)
args = [data, "--save-dir", save_dir, "--log-format", "json", "--log-interval", "1", *extra]
trainer = Trainer(*make_configs(build_parser().parse_args(args), manifest), manifest=manifest)
trainer.train()
compiled = trainer.compiled
print(json.dumps({"kind": "bench", "recompiles": None if compiled is None
                  else compiled.recompiles_since_warmup()}), flush=True)
"""


def run(tree: str, *, compile: bool, cache_dir: str, updates: int) -> dict[str, float]:
    """One nmt-train process of ``tree``: seconds from its launch to the 1st and the 3rd update,
    recompiles after the warm-up, target tokens/s after the 3rd update, and the CPU seconds of the
    whole process (less dependent on the load than the wall clock)."""
    with tempfile.TemporaryDirectory() as save_dir:
        extra = ["--max-update", str(updates), "--no-progress-bar", "--device", "cpu"]
        command = [sys.executable, "-c", CHILD, tree, DATA, save_dir, *extra]
        if compile:
            command.append("--compile")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        launched = time.time()
        result = subprocess.run(command, capture_output=True, text=True, env=env)
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    train = [r for r in records if r.get("kind") == "train"]
    timed = train[3:]
    (bench,) = [r for r in records if r.get("kind") == "bench"]
    return {
        "first": train[0]["time"] - launched,
        "third": train[2]["time"] - launched,
        "recompiles": np.nan if bench["recompiles"] is None else bench["recompiles"],
        "cpu": cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime,
        # wps is per log interval (1 update): tokens / wall time of that update.
        "tokens_per_s": sum(r["ntokens"] for r in timed)
        / sum(r["ntokens"] / r["wps"] for r in timed),
    }


def interleaved_tokens_per_second(updates: int, *, warmup: int = 2) -> dict[str, float]:
    """Target tokens/s of an eager and a compiled trainer of the default model in this process,
    taking turns update by update on the same batches, after ``warmup`` updates each."""
    from nmt.data import Update, load_manifest
    from nmt.train.compile import compile_for_shapes
    from nmt.train.trainer import Trainer
    from nmt_cli.train import build_parser, make_configs

    manifest = load_manifest(DATA)
    steppers = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        args = [DATA, "--save-dir", tempfile.mkdtemp(), "--device", "cpu", *extra]
        trainer = Trainer(
            *make_configs(build_parser().parse_args(args), manifest), manifest=manifest
        )
        if extra:
            compile_for_shapes(trainer.step, trainer.plan.static)
        batches = trainer.plan.current.rank_batches.to_list()[: warmup + updates]
        tgt = trainer.plan.current.dataset.tgt_lengths

        def step(i: int, trainer=trainer, batches=batches, tgt=tgt) -> int:
            tokens = int(tgt[batches[i]].sum())
            micro = trainer.plan.micro_batches(batches[i])
            trainer.step(Update(micro, tokens, len(batches[i]), epoch=1, ends_epoch=False))
            trainer.step.read()  # waits for the update, as a log point does
            return tokens

        steppers[name] = step
    seconds = {name: 0.0 for name in steppers}
    tokens = {name: 0 for name in steppers}
    for i in range(warmup + updates):
        for name, step in steppers.items():
            started = time.perf_counter()
            count = step(i)
            if i >= warmup:
                seconds[name] += time.perf_counter() - started
                tokens[name] += count
    return {name: tokens[name] / seconds[name] for name in steppers}


def load() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", help="a checkout of the code before (required)")
    parser.add_argument("--updates", type=int, default=10, help="per run (at least 4)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all rows")
    parser.add_argument(
        "--interleaved",
        type=int,
        default=0,
        metavar="N",
        help="only compiled vs eager tokens/s in one process, N updates each taking turns",
    )
    args = parser.parse_args()
    ensure_data()
    if not args.interleaved and not args.baseline_tree:
        parser.error("--baseline-tree is required (or --interleaved N)")
    if args.interleaved:
        before = load()
        rates = interleaved_tokens_per_second(args.interleaved)
        print(
            f"in one process, {args.interleaved} updates each taking turns (default model, CPU): "
            f"eager {rates['eager']:,.0f} tok/s, compiled {rates['compiled']:,.0f} tok/s, "
            f"compiled/eager {rates['compiled'] / rates['eager']:.2f}x "
            f"(load {before} before, {load()} after)"
        )
        return
    rows = {  # name: (tree, --compile, the compile cache: a directory per key and round)
        "this tree --compile, empty cache": (ROOT, True, "this"),
        "this tree --compile, the cache it left": (ROOT, True, "this"),
        "baseline --compile, empty cache": (args.baseline_tree, True, "baseline"),
        "this tree, eager": (ROOT, False, "eager"),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
    loads = []
    with tempfile.TemporaryDirectory() as caches:
        for round_index in range(args.repeats):
            loads.append(f"round {round_index + 1}: load {load()} before")
            for name, (tree, compile, cache) in rows.items():
                cache_dir = os.path.join(caches, f"{cache}-{round_index}")
                figures = run(tree, compile=compile, cache_dir=cache_dir, updates=args.updates)
                runs[name].append(figures)
                print(f"  {name}: {figures} (load {load()})", flush=True)
            loads[-1] += f", {load()} after"
    eager = float(np.median([r["tokens_per_s"] for r in runs["this tree, eager"]]))
    baseline_third = float(np.median([r["third"] for r in runs["baseline --compile, empty cache"]]))
    print(
        f"\nnmt-train defaults (transformer_tiny, packed, --max-tokens 2048) on Multi30k, CPU, "
        f"{args.updates} updates per run, medians of {args.repeats} round(s)"
    )
    print(
        f"{'configuration':<46} {'1st upd s':>9} {'3rd upd s':>9} {'vs base':>8} "
        f"{'recompiles':>10} {'tok/s':>7} {'vs eager':>8} {'CPU s':>7}"
    )
    for name, figures in runs.items():
        first, third, recompiles, rate, cpu = (
            float(np.median([f[key] for f in figures]))
            for key in ("first", "third", "recompiles", "tokens_per_s", "cpu")
        )
        shown = "-" if np.isnan(recompiles) else f"{recompiles:.0f}"
        print(
            f"{name:<46} {first:>9.1f} {third:>9.1f} {baseline_third / third:>7.2f}x "
            f"{shown:>10} {rate:>7,.0f} {rate / eager:>7.2f}x {cpu:>7.0f}"
        )
    print(
        "vs base: the baseline's seconds to the 3rd update over this row's (higher: sooner); "
        "CPU s: the process's user + system seconds, start to exit"
    )
    for line in loads:
        print(line)


if __name__ == "__main__":
    main()

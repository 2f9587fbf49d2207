"""One command for the day a GPU is lent: the CUDA half of nmt, run for real, within 8 minutes.

    python benchmarks/gpu.py --smoke [--steps data,cuda-tests,ddp,throughput,compile,recipe]
        [--budget STEP=SECONDS,...] [--grace 10] [--json PATH] [--recipe-minutes 1]

Every step runs in a child process, in a process group of its own, under a hard time limit: at its
budget the group gets SIGTERM, and SIGKILL --grace seconds later (a child deaf to SIGTERM, and
whatever it started, goes too). No step runs past the smoke's --limit (480 s from its start,
every start-up included): a step gets at most the time left. Then one table, and one JSON file
(--json; by default $OUT/gpu-smoke.json when $OUT is set, else WORK/gpu-smoke.json), rewritten
after each step, so a smoke cut short still leaves its rows. Steps (default budgets, seconds):

- data (30): Multi30k preprocessed once into WORK/data (--work, default runs/gpu-smoke), reused
  when there; any step that needs it brings it in;
- cuda-tests (75): ``pytest -m "cuda and not slow"`` (attention backends against SDPA, what
  ``--attention auto`` picks, no host synchronisation inside an update at fp32/bf16/fp16, packed =
  padded; the slow one, compiled training without recompiles, is the compile step's check);
- ddp (40): the losses of 2 ranks x --update-freq 1 against 1 rank x --update-freq 2, 8 updates
  (on one GPU both ranks share it through gloo: NCCL refuses two ranks on one device);
- throughput (100): target tokens/s of examples/multi30k-gpu's model and epochs, packed and
  padded, at its --max-tokens and half of it: the whole process (nmt-train's logged tokens/s,
  after its first record) beside the step alone (``benchmarks/attention.py``'s forward+backward
  on Multi30k-like batches of the same budget), and their ratio: what the host, data and
  optimizer cost;
- compile (100): nmt-train --compile with its default model at bf16: the start-up (every shape
  compiled) and compiled/eager tokens/s, one process each, the same flags otherwise (a recompile
  after the warm-up is an error in nmt-train, so a pass means none);
- recipe (120): examples/multi30k-gpu/run.py for --recipe-minutes on WORK/data: test2016 BLEU.

--dry-run-cpu runs the same orchestration on the CPU with tiny settings (300 sentences, a 1+1 x 32
model, a few updates, budgets of its own) so that its limits, kills, table and JSON are tested
(tests/test_gpu_smoke.py); there --hang STEP makes that step's child ignore SIGTERM and sleep.

    python benchmarks/gpu.py --table [--max-tokens 16384]

The attention backends and batch layouts side by side, one training step (forward, output
projection of the real target positions, cross-entropy, backward) of transformer_base and
transformer_big at bf16 autocast on Multi30k-like batches (``benchmarks/attention.py``'s): step
time, target tokens/s, peak memory and MFU. MFU counts the useful work only (real tokens, no
padding): 3 x the forward's 2 x multiply-adds of every weight matrix a token passes through (the
decoder's cross-attention keys and values once per source token and decoder layer), the attention
products over each sample's own length (causal self-attention counted whole), and the output
projection; over the GPU's dense bf16 peak (989 TFLOP/s on H100/H200 SXM; ``--peak-tflops``).
Without CUDA (and without --dry-run-cpu) it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from nmt.results import read_results

STARTED = time.monotonic()  # the smoke's limit counts from here: this process's start-up is in it
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

LIMIT_S = 480.0  # 8 minutes
DRY_LIMIT_S = 1800.0
RESULT_PREFIX = "gpu-smoke result: "
MIN_STEP_S = 1.0  # a step given less than this is skipped, not started
TINY_MODEL = [
    *("--encoder-layers", "1", "--decoder-layers", "1"),
    *("--encoder-embed-dim", "32", "--decoder-embed-dim", "32"),
    *("--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"),
]
TINY_LINES = 300


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    budget_s: float  # on a GPU
    dry_budget_s: float  # --dry-run-cpu, on a busy 2-core machine
    needs_data: bool


STEPS = (
    Step("data", "Multi30k dataset", 30, 120, False),
    Step("cuda-tests", "CUDA tests (-m 'cuda and not slow')", 75, 150, False),
    Step("ddp", "2 ranks = 1 rank x --update-freq 2", 40, 240, True),
    Step("throughput", "tokens/s: whole process vs step", 100, 400, True),
    Step("compile", "--compile: start-up, compiled/eager", 100, 480, True),
    Step("recipe", "examples/multi30k-gpu: test2016 BLEU", 120, 300, True),
)
STEP_BY_NAME = {step.name: step for step in STEPS}


@dataclass(frozen=True)
class Settings:
    """What a step runs on: the GPU, or the CPU with tiny settings (--dry-run-cpu)."""

    work: Path
    dry_run: bool
    recipe_minutes: float

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def child_args(self) -> list[str]:
        return [
            *("--work", str(self.work), "--recipe-minutes", str(self.recipe_minutes)),
            *(["--dry-run-cpu"] if self.dry_run else []),
        ]


@dataclass
class Outcome:
    """What a step's child reports (its last line of output, after RESULT_PREFIX)."""

    verdict: str  # pass | FAIL
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finished:
    """How a child process ended under its limit."""

    returncode: int
    output: str
    seconds: float
    timed_out: bool  # the limit came first
    killed: bool  # still there --grace seconds after SIGTERM: SIGKILL


# ----------------------------------------------------------------------------- time limits
def run_limited(command: list[str], *, limit_s: float, grace_s: float) -> Finished:
    """Run ``command`` in a new process group; at ``limit_s`` SIGTERM the group, ``grace_s`` later
    SIGKILL it. Whatever is left of the group when the child ends goes too, so nothing a step
    started outlives it. Output goes to a file, not a pipe: a child never blocks on a reader, and
    what it wrote before a kill is kept."""
    started = time.monotonic()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        timed_out = killed = False
        try:
            try:
                process.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                signal_group(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    killed = True
        finally:  # also when this process is interrupted: no child outlives the smoke
            signal_group(process.pid, signal.SIGKILL)
            process.wait()
        output.seek(0)
        text = output.read().decode(errors="replace")
    return Finished(process.returncode, text, time.monotonic() - started, timed_out, killed)


def signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


def exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_limited's cleanup


# ----------------------------------------------------------------------------- the smoke
def smoke(args: argparse.Namespace, steps: list[Step], *, limit_s: float) -> int:
    settings = Settings(args.work, args.dry_run_cpu, args.recipe_minutes)
    settings.work.mkdir(parents=True, exist_ok=True)
    json_path = args.json or default_json_path(settings.work)
    report: dict[str, Any] = {
        **describe_machine(dry_run=args.dry_run_cpu),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "limit_s": limit_s,
        "grace_s": args.grace,
        "seconds": 0.0,
        "steps": [],
    }
    deadline = STARTED + limit_s
    for step in steps:
        budget = args.budget.get(
            step.name, step.dry_budget_s if args.dry_run_cpu else step.budget_s
        )
        row = run_step(
            step,
            settings,
            limit_s=min(budget, deadline - time.monotonic() - args.grace),
            grace_s=args.grace,
            hang=step.name == args.hang,
            data_ready=all(r["status"] == "pass" for r in report["steps"] if r["name"] == "data"),
        )
        row["budget_s"] = budget
        report["steps"].append(row)
        report["seconds"] = round(time.monotonic() - STARTED, 1)
        write_json(json_path, report)
        print(f"  {step.name}: {row['status']} ({row['seconds']:.0f} s)", flush=True)
    print_table(report)
    print(f"JSON: {json_path}")
    return 0 if all(row["status"] == "pass" for row in report["steps"]) else 1


def run_step(
    step: Step, settings: Settings, *, limit_s: float, grace_s: float, hang: bool, data_ready: bool
) -> dict[str, Any]:
    row: dict[str, Any] = {"name": step.name, "title": step.title, "limit_s": round(limit_s, 1)}
    if limit_s < MIN_STEP_S:
        return {**row, "status": "skipped", "detail": "no time left", "seconds": 0.0}
    if step.needs_data and not data_ready:
        return {
            **row,
            "status": "skipped",
            "detail": "no dataset: data did not pass",
            "seconds": 0.0,
        }
    if hang:
        command = [sys.executable, "-c", HANG]
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", step.name]
        command += settings.child_args()
    finished = run_limited(command, limit_s=limit_s, grace_s=grace_s)
    row["seconds"] = round(finished.seconds, 1)
    row["output_tail"] = finished.output[-3000:]
    outcome = parse_outcome(finished.output)
    if finished.timed_out:  # what the step measured before its limit, or its last words
        ending = f"SIGKILL {grace_s:g} s after SIGTERM" if finished.killed else "SIGTERM ended it"
        before = f"done before: {outcome.detail}" if outcome else last_line(finished.output)
        return {
            **row,
            "status": "timeout",
            "detail": f"stopped at its {limit_s:.0f} s limit ({ending})"
            + (f"; {before}" if before else ""),
            "killed": finished.killed,
            "figures": outcome.figures if outcome else {},
        }
    if outcome is None:
        return {
            **row,
            "status": "FAIL",
            "detail": f"exit {finished.returncode}: {last_line(finished.output) or 'no output'}",
        }
    return {**row, "status": outcome.verdict, "detail": outcome.detail, "figures": outcome.figures}


# A step that ignores SIGTERM, and so does the process it starts (--hang: the kill is tested).
# It reports a partial result first, as the long steps do after each measurement.
HANG = (
    "import json, os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "deaf = 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'\n"
    "child = subprocess.Popen([sys.executable, '-c', deaf])\n"
    "detail = f'hanging: pid {os.getpid()}, child pid {child.pid}'\n"
    "partial = {'verdict': 'pass', 'detail': detail, 'figures': {'pids': [os.getpid(), child.pid]}}\n"
    f"print({RESULT_PREFIX!r} + json.dumps(partial), flush=True)\n"
    "time.sleep(600)\n"
)


def report(outcome: Outcome) -> None:
    """A step's result for the parent; a long step reports partial ones too (the last one counts)."""
    print(RESULT_PREFIX + json.dumps(dataclasses.asdict(outcome)), flush=True)


def parse_outcome(output: str) -> Outcome | None:
    lines = [line for line in output.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        return None
    return Outcome(**json.loads(lines[-1][len(RESULT_PREFIX) :]))


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def default_json_path(work: Path) -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "gpu-smoke.json" if out else work / "gpu-smoke.json"


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, path)


def describe_machine(*, dry_run: bool) -> dict[str, Any]:
    import torch

    device = "cpu (--dry-run-cpu)" if dry_run else torch.cuda.get_device_name(0)
    return {"device": device, "torch": torch.__version__, "dry_run": dry_run}


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\n{report['device']}, torch {report['torch']}: {report['seconds']:.0f} s "
        f"(limit {report['limit_s']:.0f} s)"
    )
    print(f"{'step':<11} {'title':<38} {'result':<8} {'s / limit':>11}  detail")
    for row in report["steps"]:
        seconds = f"{row['seconds']:.0f} / {row['limit_s']:.0f}"
        print(
            f"{row['name']:<11} {row['title']:<38} {row['status']:<8} {seconds:>11}  {row['detail']}"
        )


# ----------------------------------------------------------------------------- the steps (children)
def load_recipe() -> ModuleType:
    """examples/multi30k-gpu/run.py (a script, not a package): its flags, preprocessing, tee."""
    spec = importlib.util.spec_from_file_location(
        "multi30k_gpu", ROOT / "examples" / "multi30k-gpu" / "run.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPE = load_recipe()


def step_data(settings: Settings) -> Outcome:
    if (settings.data / "manifest.json").exists():
        return Outcome("pass", f"reused {settings.data}")
    started = time.perf_counter()
    if settings.dry_run:  # the first lines of each file, and a vocabulary to match
        corpus = settings.work / "raw"
        corpus.mkdir(parents=True, exist_ok=True)
        for prefix in ("train", "val", "test_2016_flickr"):
            for lang in ("en", "de"):
                with gzip.open(RECIPE.CORPUS / f"{prefix}.{lang}.gz", "rt") as source:
                    lines = [line for _, line in zip(range(TINY_LINES), source)]
                (corpus / f"{prefix}.{lang}").write_text("".join(lines))
        RECIPE.preprocess(settings.data, corpus=corpus, extra=("--spm-vocab-size", "300"))
    else:
        RECIPE.preprocess(settings.data)
    manifest = json.loads((settings.data / "manifest.json").read_text())
    return Outcome(
        "pass", f"{settings.data} in {time.perf_counter() - started:.0f} s", {"manifest": manifest}
    )


def step_cuda_tests(settings: Settings) -> Outcome:
    # On the CPU every CUDA test skips: one file is enough to run the step through.
    where = "tests/model/test_attention.py" if settings.dry_run else "tests"
    code, output = RECIPE.tee(
        [sys.executable, "-m", "pytest", "-q", "-rf", "--tb=line", "-m", "cuda and not slow", where]
    )
    lines = output.splitlines()
    summary = next((line.strip() for line in reversed(lines) if " in " in line), last_line(output))
    failed = [line.strip() for line in lines if line.startswith("FAILED ")]
    return Outcome("pass" if code == 0 else "FAIL", " | ".join([summary, *failed]))


def train_command(settings: Settings, save_dir: Path, *flags: str, procs: int = 1) -> list[str]:
    launcher = [sys.executable]
    if procs > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(procs)]
    return [
        *launcher,
        *("-m", "nmt_cli.train", str(settings.data), "--save-dir", str(save_dir)),
        *("--log-format", "json", "--no-progress-bar", "--device", settings.device),
        *flags,
    ]


def train_records(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"kind": "train"')]


def logged_tokens_per_second(output: str) -> float:
    """Target tokens/s of nmt-train's training records after the first (start-up and warm-up in
    its window): each record's tokens over its window's wall time."""
    timed = train_records(output)[1:]
    if not timed:
        raise RuntimeError(f"nmt-train logged fewer than 2 training records: {last_line(output)}")
    return sum(r["ntokens"] for r in timed) / sum(r["ntokens"] / r["wps"] for r in timed)


def step_ddp(settings: Settings) -> Outcome:
    import torch

    updates = 4 if settings.dry_run else 8
    flags = ["--max-update", str(updates), "--log-interval", "1", "--dropout", "0.1"]
    flags += [*TINY_MODEL, "--max-tokens", "256"] if settings.dry_run else []
    # One GPU: both ranks on it, and NCCL refuses two ranks on one device ("Duplicate GPU
    # detected"), so the GPU tensors go through gloo; the NCCL path needs 2 GPUs.
    shared = not settings.dry_run and torch.cuda.device_count() < 2
    two_rank = ["--device", "cuda:0", "--distributed-backend", "gloo"] if shared else []
    with tempfile.TemporaryDirectory() as tmp:
        # At the same time: the losses do not depend on timing, and the step has one budget.
        runs = [
            subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            for command in (
                train_command(settings, Path(tmp, "one"), *flags, "--update-freq", "2"),
                train_command(settings, Path(tmp, "two"), *flags, *two_rank, procs=2),
            )
        ]
        outputs = [run.communicate()[0] for run in runs]
    where = "CPU, gloo" if settings.dry_run else ("1 GPU shared, gloo" if shared else "NCCL")
    for run, output, name in zip(runs, outputs, ("1 rank", "2 ranks")):
        if run.returncode:
            print(output[-4000:])
            return Outcome("FAIL", f"{name} ({where}) exit {run.returncode}: {last_line(output)}")
    one, two = ([r["loss"] for r in train_records(output)] for output in outputs)
    if not one or len(one) != len(two):
        return Outcome("FAIL", f"{len(one)} and {len(two)} loss records ({where})")
    worst = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(one, two))
    verdict = "pass" if len(one) == updates and worst < 1e-4 else "FAIL"
    return Outcome(
        verdict,
        f"{updates} updates, largest relative loss difference {worst:.1e} ({where})",
        {"updates": updates, "worst_relative_difference": worst, "where": where},
    )


def throughput_settings(settings: Settings) -> tuple[list[str], list[int], int, int]:
    """Model flags, --max-tokens values, updates and log interval of the throughput step."""
    if settings.dry_run:
        return TINY_MODEL, [256, 512], 6, 2
    flags = [*RECIPE.MODEL_FLAGS, *RECIPE.EPOCH_FLAGS, "--bf16"]
    return flags, [RECIPE.MAX_TOKENS // 2, RECIPE.MAX_TOKENS], 60, 20


def step_throughput(settings: Settings) -> Outcome:
    model_flags, budgets, updates, interval = throughput_settings(settings)
    figures: dict[str, Any] = {}
    for layout in ("packed", "padded"):
        for max_tokens in budgets:
            flags = [*model_flags, "--layout", layout, "--max-tokens", str(max_tokens)]
            with tempfile.TemporaryDirectory() as tmp:
                code, output = RECIPE.tee(
                    train_command(
                        settings,
                        Path(tmp),
                        *flags,
                        *("--max-update", str(updates), "--log-interval", str(interval)),
                        # No validation or epoch checkpoint inside the measured updates.
                        *("--validate-interval", "1000", "--save-interval", "1000"),
                    )
                )
            if code:
                return Outcome("FAIL", f"nmt-train {layout} {max_tokens}: {last_line(output)}")
            process = logged_tokens_per_second(output)
            step = step_tokens_per_second(settings, flags, layout=layout, max_tokens=max_tokens)
            figures[f"{layout} {max_tokens}"] = {
                "process_tok_s": process,
                "step_tok_s": step,
                "process_over_step": process / step,
            }
            report(throughput_outcome(figures))
    return throughput_outcome(figures)


def throughput_outcome(figures: dict[str, Any]) -> Outcome:
    detail = " | ".join(
        f"{name}: {f['process_tok_s']:,.0f} vs {f['step_tok_s']:,.0f} tok/s "
        f"({f['process_over_step']:.2f})"
        for name, f in figures.items()
    )
    return Outcome("pass", detail, figures)


def step_tokens_per_second(
    settings: Settings, flags: list[str], *, layout: str, max_tokens: int
) -> float:
    """benchmarks/attention.py's training step alone (forward, output projection, loss,
    backward; no optimizer, no data loading) on Multi30k-like batches of the same budget, with
    the model nmt-train builds from ``flags`` on this dataset."""
    import torch
    from attention import make_batch, multi30k_like_lengths, time_step, token_budget_batches

    from nmt.data import load_manifest
    from nmt.model import build_model
    from nmt_cli.train import build_parser, make_configs

    manifest = load_manifest(str(settings.data))
    _, cfg = make_configs(build_parser().parse_args([str(settings.data), *flags]), manifest)
    torch.manual_seed(0)
    device = torch.device(settings.device)
    model = build_model(cfg).to(device).train()
    rng = np.random.default_rng(1)
    src, tgt = multi30k_like_lengths(20_000, rng=rng)
    packed = layout == "packed"
    indices = token_budget_batches(
        rng.permutation(len(src)), src, tgt, max_tokens=max_tokens, padded=not packed
    )[: 3 if settings.dry_run else 8]
    batches = [make_batch(src[i], tgt[i], vocab=cfg.tgt_vocab_size, device=device) for i in indices]
    autocast = not settings.dry_run
    for batch in batches:  # warm-up: kernels chosen, allocator grown
        time_step(model, batch, packed=packed, autocast=autocast)
    seconds = sum(time_step(model, b, packed=packed, autocast=autocast) for b in batches)
    return sum(b.num_target_tokens for b in batches) / seconds


def step_compile(settings: Settings) -> Outcome:
    if settings.dry_run:  # one padded shape: CPU compilation of many would take minutes
        flags = [
            *TINY_MODEL,
            "--max-tokens",
            "256",
            "--layout",
            "padded",
            "--length-multiple",
            "64",
        ]
        flags += ["--max-update", "6", "--log-interval", "2"]
    else:
        flags = ["--bf16", "--max-update", "200", "--log-interval", "50"]
    flags += ["--validate-interval", "1000", "--save-interval", "1000"]
    figures: dict[str, Any] = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            code, output = RECIPE.tee(train_command(settings, Path(tmp), *flags, *extra))
            wall = time.perf_counter() - started
        if code:
            return Outcome("FAIL", f"{name}: exit {code}: {last_line(output)}", figures)
        figures[name] = {"tok_s": logged_tokens_per_second(output), "process_s": wall}
        report(Outcome("pass", f"{name}: {figures[name]['tok_s']:,.0f} tok/s", figures))
    warmup = re.search(r"compiled (\d+) shapes in ([0-9.]+)s", output)
    if warmup is None:
        return Outcome("FAIL", "no 'compiled N shapes' line in nmt-train's log", figures)
    figures["compiled"].update(shapes=int(warmup.group(1)), warmup_s=float(warmup.group(2)))
    ratio = figures["compiled"]["tok_s"] / figures["eager"]["tok_s"]
    figures["compiled_over_eager"] = ratio
    return Outcome(
        "pass",
        f"{warmup.group(1)} shapes compiled in {float(warmup.group(2)):.0f} s (process "
        f"{figures['compiled']['process_s']:.0f} s vs {figures['eager']['process_s']:.0f} s "
        f"eager); {figures['compiled']['tok_s']:,.0f} vs {figures['eager']['tok_s']:,.0f} tok/s "
        f"({ratio:.2f}x); no recompile (an error after the warm-up)",
        figures,
    )


def step_recipe(settings: Settings) -> Outcome:
    out = settings.work / "recipe"
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: the same --out would resume the last
    command = [
        *(sys.executable, "examples/multi30k-gpu/run.py", "--out", str(out)),
        *("--minutes", str(settings.recipe_minutes), "--data", str(settings.data)),
        *("--device", settings.device),
    ]
    if settings.dry_run:
        command += ["--", *TINY_MODEL, "--max-tokens", "256", "--max-update", "4"]
        command += ["--save-interval-updates", "2"]
    code, output = RECIPE.tee(command)
    if code:
        return Outcome("FAIL", f"exit {code}: {last_line(output)}")
    figures = read_results(str(out / "results.json")).figures
    return Outcome(
        "pass",
        f"test2016 BLEU {figures['bleu']:.2f} (val {figures['valid_bleu']:.2f}) after "
        f"{figures['updates']} updates in {figures['train_minutes']} min (the recipe's 5 minutes "
        "aim at >= 40)",
        figures,
    )


CHILDREN: dict[str, Callable[[Settings], Outcome]] = {
    "data": step_data,
    "cuda-tests": step_cuda_tests,
    "ddp": step_ddp,
    "throughput": step_throughput,
    "compile": step_compile,
    "recipe": step_recipe,
}


def child_main(args: argparse.Namespace) -> int:
    report(CHILDREN[args.child](Settings(args.work, args.dry_run_cpu, args.recipe_minutes)))
    return 0


# ----------------------------------------------------------------------------- the backend table
def training_flops(cfg, src_lengths, tgt_lengths) -> float:
    """FLOPs of one training step's useful work (module docstring), for samples of these lengths."""
    src = np.asarray(src_lengths, dtype=np.float64)
    tgt = np.asarray(tgt_lengths, dtype=np.float64)
    d_enc, d_dec = cfg.encoder_embed_dim, cfg.decoder_embed_dim
    encoder_macs = cfg.encoder_layers * (
        src.sum() * (4 * d_enc**2 + 2 * d_enc * cfg.encoder_ffn_embed_dim)
        + 2 * d_enc * (src**2).sum()  # scores and weighted sum over the sample's own tokens
    )
    decoder_macs = cfg.decoder_layers * (
        tgt.sum() * (4 * d_dec**2 + 2 * d_dec**2 + 2 * d_dec * cfg.decoder_ffn_embed_dim)
        + src.sum() * 2 * d_enc * d_dec  # cross-attention keys and values
        + 2 * d_dec * ((tgt**2).sum() + (tgt * src).sum())
    )
    output_macs = tgt.sum() * d_dec * cfg.tgt_vocab_size
    return 3 * 2 * (encoder_macs + decoder_macs + output_macs)


def backend_table(
    *, max_tokens: int, num_batches: int, repeats: int, peak_tflops: float, device: str = "cuda"
) -> None:
    import torch
    from attention import make_batch, multi30k_like_lengths, token_budget_batches, train_step

    from nmt.config import model_config
    from nmt.model import build_model

    vocab = 32_000
    rng = np.random.default_rng(1)
    src, tgt = multi30k_like_lengths(200_000, rng=rng)
    order = rng.permutation(len(src))
    layouts = {  # the padded budget counts padding (fairseq); the packed one real tokens only
        layout: token_budget_batches(
            order, src, tgt, max_tokens=max_tokens, padded=layout == "padded"
        )[:num_batches]
        for layout in ("padded", "packed")
    }
    print(
        f"\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}, bf16 autocast, "
        f"max tokens {max_tokens}, vocab {vocab}, {num_batches} batches x {repeats} passes, "
        f"MFU over {peak_tflops:.0f} TFLOP/s"
    )
    print(
        f"{'arch':<17} {'backend':<9} {'layout':<7} {'ms/step':>8} {'tgt tok/s':>10} "
        f"{'peak GiB':>9} {'MFU':>6} {'vs sdpa padded':>15}"
    )
    for arch in ("transformer_base", "transformer_big"):
        reference = None
        for backend, layout in (
            ("sdpa", "padded"),
            ("sdpa", "packed"),
            ("xformers", "padded"),
            ("xformers", "packed"),
            ("varlen", "packed"),
        ):
            torch.manual_seed(0)
            cfg = model_config(
                arch, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0, attention=backend
            )
            model = build_model(cfg).to(device).train()
            batches = [
                make_batch(src[i], tgt[i], vocab=vocab, device=device) for i in layouts[layout]
            ]
            packed = layout == "packed"
            try:
                for batch in batches:  # warm-up: kernels chosen, allocator grown
                    train_step(model, batch, packed=packed, autocast=True)
            except ValueError as error:  # a backend that cannot run here (e.g. no xFormers)
                print(f"{arch:<17} {backend:<9} {layout:<7} skipped: {error}")
                continue
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            for _ in range(repeats):
                for batch in batches:
                    train_step(model, batch, packed=packed, autocast=True)
                    model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / (repeats * len(batches))
            flops = sum(training_flops(cfg, src[i], tgt[i]) for i in layouts[layout]) / len(batches)
            tokens = sum(int(tgt[i].sum()) for i in layouts[layout]) / len(batches)
            speed = tokens / seconds
            reference = reference or speed
            print(
                f"{arch:<17} {backend:<9} {layout:<7} {seconds * 1e3:8.1f} {speed:10.0f} "
                f"{torch.cuda.max_memory_allocated() / 2**30:9.1f} "
                f"{flops / seconds / (peak_tflops * 1e12):6.1%} {speed / reference:14.2f}x",
                flush=True,
            )
            del model, batches
            torch.cuda.empty_cache()
        print(
            f"  (FLOPs per step, mean: {np.mean([training_flops(cfg, src[i], tgt[i]) for i in layouts['packed']]) / 1e12:.2f} T)"
        )


# ----------------------------------------------------------------------------- command line
def parse_steps(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in STEP_BY_NAME]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"steps are {', '.join(STEP_BY_NAME)}, comma-separated; got {text!r}"
        )
    return names


def parse_budgets(text: str) -> dict[str, float]:
    budgets = {}
    for item in text.split(","):
        name, _, seconds = item.partition("=")
        if name.strip() not in STEP_BY_NAME:
            raise argparse.ArgumentTypeError(
                f"STEP=SECONDS,... with STEP one of {', '.join(STEP_BY_NAME)}; got {item!r}"
            )
        budgets[name.strip()] = positive(seconds)
    return budgets


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the steps above, in 8 minutes")
    parser.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="the smoke's orchestration on the CPU, tiny settings (tests)",
    )
    parser.add_argument(
        "--steps",
        type=parse_steps,
        default=list(STEP_BY_NAME),
        help=f"the smoke's steps, comma-separated (default: all: {','.join(STEP_BY_NAME)})",
    )
    parser.add_argument(
        "--budget", type=parse_budgets, default={}, help="STEP=SECONDS,...: a step's time limit"
    )
    parser.add_argument(
        "--grace",
        type=positive,
        default=10.0,
        help="seconds between a step's SIGTERM and SIGKILL",
    )
    parser.add_argument(
        "--limit",
        type=positive,
        help=f"the whole smoke's seconds (default {LIMIT_S:.0f}; --dry-run-cpu {DRY_LIMIT_S:.0f})",
    )
    parser.add_argument("--json", type=Path, help="the report (default: $OUT/gpu-smoke.json)")
    parser.add_argument(
        "--work", type=Path, default=ROOT / "runs" / "gpu-smoke", help="dataset and runs"
    )
    parser.add_argument(
        "--recipe-minutes", type=positive, default=1.0, help="the recipe step's training minutes"
    )
    parser.add_argument(
        "--hang", choices=list(STEP_BY_NAME), help="--dry-run-cpu: this step ignores SIGTERM"
    )
    parser.add_argument("--child", choices=list(STEP_BY_NAME), help=argparse.SUPPRESS)
    parser.add_argument("--table", action="store_true", help="the backend table (~2 minutes)")
    parser.add_argument("--max-tokens", type=int, default=16384, help="--table's token budget")
    parser.add_argument("--num-batches", type=int, default=4, help="--table's distinct batches")
    parser.add_argument("--repeats", type=int, default=3, help="--table's timed passes")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak, for MFU")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    if not (args.smoke or args.dry_run_cpu or args.table):
        parser.error("say --smoke, --dry-run-cpu, --table or both")
    if args.hang and not (args.dry_run_cpu and args.hang in args.steps):
        parser.error("--hang: only with --dry-run-cpu, and one of its --steps")
    wanted = set(args.steps)
    if any(STEP_BY_NAME[name].needs_data for name in wanted):
        wanted.add("data")
    steps = [step for step in STEPS if step.name in wanted]
    limit_s = args.limit or (DRY_LIMIT_S if args.dry_run_cpu else LIMIT_S)
    planned = sum(
        args.budget.get(s.name, s.dry_budget_s if args.dry_run_cpu else s.budget_s) for s in steps
    )
    if (args.smoke or args.dry_run_cpu) and planned > limit_s:
        parser.error(
            f"--budget: the steps' budgets sum to {planned:.0f} s, over the smoke's "
            f"{limit_s:.0f} s (--limit)"
        )
    import torch

    if not args.dry_run_cpu and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py: no CUDA device here; nothing to run (the CUDA tests skip on the CPU)"
        )
        return 0
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    code = smoke(args, steps, limit_s=limit_s) if args.smoke or args.dry_run_cpu else 0
    if args.table:
        backend_table(
            max_tokens=args.max_tokens,
            num_batches=args.num_batches,
            repeats=args.repeats,
            peak_tflops=args.peak_tflops,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())

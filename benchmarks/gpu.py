"""One command for the day a GPU is lent: the CUDA half of nmt, run for real, in minutes.

    python benchmarks/gpu.py --smoke

Steps, then one table:
1. the CUDA tests (``pytest -m cuda``: xFormers and varlen against SDPA, packed = padded on the GPU,
   no host synchronisation inside an update at fp32/bf16/fp16, fp16 decoding, compile);
2. 2 processes under torchrun on the GPU(s) with nmt's CUDA process group (cpu:gloo,cuda:nccl):
   the losses of 2 ranks x --update-freq 1 must equal those of 1 rank x --update-freq 2 (NCCL wants a
   GPU per rank: on one GPU both ranks share it when NCCL allows it, and the row says what happened);
3. attention backends at bf16: xFormers on the packed layout against PyTorch SDPA on the padded one
   (``benchmarks/attention.py``'s CUDA rows);
4. ``nmt-train --compile --bf16``: recompiles after the warm-up (must be 0).
Without CUDA it says so in one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def run(
    command: list[str], *, timeout: int, env: dict[str, str] | None = None
) -> tuple[int, str, float]:
    started = time.perf_counter()
    try:
        result = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
        )
        return result.returncode, result.stdout + result.stderr, time.perf_counter() - started
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace") + (error.stderr or b"").decode(
            errors="replace"
        )
        return 124, output, time.perf_counter() - started


def cuda_tests() -> tuple[str, str]:
    code, output, seconds = run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests"], timeout=240
    )
    summary = next(
        (line for line in reversed(output.splitlines()) if " in " in line), output[-200:]
    )
    return ("pass" if code == 0 else "FAIL"), f"{summary.strip()} ({seconds:.0f} s)"


def train_losses(
    data: str, save_dir: str, *, procs: int, update_freq: int, device: str
) -> tuple[int, list[float], str]:
    args = [
        data,
        "--save-dir",
        save_dir,
        "--device",
        device,
        "--max-update",
        "8",
        "--log-interval",
        "1",
        "--log-format",
        "json",
        "--update-freq",
        str(update_freq),
        "--dropout",
        "0.1",
        "--no-progress-bar",
    ]
    if procs == 1:
        command = [sys.executable, "-m", "nmt_cli.train", *args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(procs),
            "-m",
            "nmt_cli.train",
            *args,
        ]
    code, output, _ = run(command, timeout=180)
    losses = [
        json.loads(line)["loss"]
        for line in output.splitlines()
        if line.startswith('{"kind": "train"')
    ]
    return code, losses, output


def ddp_invariance(data: str) -> tuple[str, str]:
    import torch

    device = "cuda" if torch.cuda.device_count() >= 2 else "cuda:0"  # one GPU: both ranks on it
    with tempfile.TemporaryDirectory() as tmp:
        code1, one, out1 = train_losses(data, f"{tmp}/one", procs=1, update_freq=2, device="cuda")
        code2, two, out2 = train_losses(data, f"{tmp}/two", procs=2, update_freq=1, device=device)
    if code1 or code2:
        failed = out1 if code1 else out2
        reason = next(
            (line for line in failed.splitlines() if "error" in line.lower()), failed[-300:]
        )
        return "FAIL", f"{'1 rank' if code1 else '2 ranks'} on {device}: {reason.strip()[:300]}"
    worst = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(one, two))
    verdict = "pass" if len(one) == len(two) == 8 and worst < 1e-4 else "FAIL"
    return (
        verdict,
        f"8 updates, largest relative loss difference {worst:.1e} ({torch.cuda.device_count()} GPU(s))",
    )


def attention_rows() -> tuple[str, str]:
    code, output, seconds = run(
        [sys.executable, "benchmarks/attention.py", "--num-batches", "2", "--repeats", "2"],
        timeout=240,
    )
    rows = [
        line.strip() for line in output.splitlines() if re.search(r"xformers|sdpa|varlen", line)
    ]
    return ("pass" if code == 0 else "FAIL"), (
        " | ".join(rows[-6:]) or output[-300:]
    ) + f" ({seconds:.0f} s)"


def compile_recompiles(data: str) -> tuple[str, str]:
    import torch

    from nmt.data import load_manifest
    from nmt.train.trainer import Trainer
    from nmt_cli.train import build_parser, make_configs

    with tempfile.TemporaryDirectory() as tmp:
        args = [
            data,
            "--save-dir",
            tmp,
            "--device",
            "cuda",
            "--compile",
            "--bf16",
            "--max-update",
            "40",
            "--no-progress-bar",
        ]
        manifest = load_manifest(data)
        trainer = Trainer(
            *make_configs(build_parser().parse_args(args), manifest), manifest=manifest
        )
        try:
            trainer.train()
            compiled = trainer.compiled
            recompiles = compiled.recompiles_since_warmup()
            note = f"{len(compiled.shapes)} shapes compiled in {compiled.warmup_seconds:.0f} s, {recompiles} recompiles in 40 updates"
            return ("pass" if recompiles == 0 else "FAIL"), note
        finally:
            torch.compiler.set_stance("default")
            torch.compiler.reset()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the checks above, at most ~5 minutes")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py: no CUDA device here; nothing to run (the CUDA tests skip on the CPU)"
        )
        return 0
    if not args.smoke:
        parser.error("only --smoke is implemented; the full GPU table is issue 26's")
    from train_throughput import DATA, ensure_data

    ensure_data()
    started = time.perf_counter()
    rows = []
    for name, check in (
        ("CUDA tests", cuda_tests),
        ("2 ranks = 1 rank x 2 (DDP, losses)", lambda: ddp_invariance(DATA)),
        ("xFormers packed vs SDPA padded, bf16", attention_rows),
        ("--compile --bf16: recompiles after warm-up", lambda: compile_recompiles(DATA)),
    ):
        try:
            verdict, note = check()
        except Exception as error:  # a failed step is a row, not the end of the smoke
            verdict, note = "FAIL", f"{type(error).__name__}: {error}"[:300]
        rows.append((name, verdict, note))
        print(f"  {name}: {verdict}", flush=True)
    print(
        f"\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {time.perf_counter() - started:.0f} s"
    )
    print(f"{'check':<44} {'result':<6}  detail")
    for name, verdict, note in rows:
        print(f"{name:<44} {verdict:<6}  {note}")
    return 0 if all(verdict == "pass" for _, verdict, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

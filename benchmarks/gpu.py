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

    python benchmarks/gpu.py --table [--max-tokens 16384]

The attention backends and batch layouts side by side, one training step (forward, output
projection of the real target positions, cross-entropy, backward) of transformer_base and
transformer_big at bf16 autocast on Multi30k-like batches (``benchmarks/attention.py``'s): step
time, target tokens/s, peak memory and MFU. MFU counts the useful work only (real tokens, no
padding): 3 x the forward's 2 x multiply-adds of every weight matrix a token passes through (the
decoder's cross-attention keys and values once per source token and decoder layer), the attention
products over each sample's own length (causal self-attention counted whole), and the output
projection; over the GPU's dense bf16 peak (989 TFLOP/s on H100/H200 SXM; ``--peak-tflops``).
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

import numpy as np

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
        [sys.executable, "-m", "pytest", "-q", "-rf", "--tb=line", "-m", "cuda", "tests"],
        timeout=240,
    )
    lines = output.splitlines()
    summary = next((line for line in reversed(lines) if " in " in line), output[-200:])
    failed = [line.strip() for line in lines if line.startswith("FAILED ")]
    return ("pass" if code == 0 else "FAIL"), " | ".join(
        [f"{summary.strip()} ({seconds:.0f} s)", *failed]
    )


def train_losses(
    data: str, save_dir: str, *, procs: int, update_freq: int, extra: list[str]
) -> tuple[int, list[float], str]:
    args = [
        data,
        "--save-dir",
        save_dir,
        "--device",
        "cuda",
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
        *extra,
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

    # One GPU: both ranks on it, and NCCL refuses two ranks on one device ("Duplicate GPU
    # detected"), so the GPU tensors go through gloo; the NCCL path needs 2 GPUs.
    shared = torch.cuda.device_count() < 2
    extra = ["--device", "cuda:0", "--distributed-backend", "gloo"] if shared else []
    with tempfile.TemporaryDirectory() as tmp:
        code1, one, out1 = train_losses(data, f"{tmp}/one", procs=1, update_freq=2, extra=[])
        code2, two, out2 = train_losses(data, f"{tmp}/two", procs=2, update_freq=1, extra=extra)
    device = "1 GPU shared, gloo" if shared else "NCCL"
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
        f"8 updates, largest relative loss difference {worst:.1e} ({device})",
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the checks above, at most ~5 minutes")
    parser.add_argument("--table", action="store_true", help="the backend table (~2 minutes)")
    parser.add_argument("--max-tokens", type=int, default=16384, help="--table's token budget")
    parser.add_argument("--num-batches", type=int, default=4, help="--table's distinct batches")
    parser.add_argument("--repeats", type=int, default=3, help="--table's timed passes")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak, for MFU")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py: no CUDA device here; nothing to run (the CUDA tests skip on the CPU)"
        )
        return 0
    if not (args.smoke or args.table):
        parser.error("say --smoke, --table or both")
    if args.table:
        backend_table(
            max_tokens=args.max_tokens,
            num_batches=args.num_batches,
            repeats=args.repeats,
            peak_tflops=args.peak_tflops,
        )
        if not args.smoke:
            return 0
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

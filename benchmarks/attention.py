"""Forward+backward time of one encoder-decoder training step, per batch layout and attention backend.

transformer_tiny (8k vocabularies) on Multi30k-like synthetic batches of ``--max-tokens`` tokens
(lengths ~ mean 14, range 3-40, as Multi30k en-de after SentencePiece):

- padded, random batching: samples in random order, padded to the longest in the batch;
- padded, length-sorted batching: samples sorted by length first (little padding);
- packed, same random batches: those samples back to back (no padding; sdpa gathers a padded view
  only around each attention call);
- packed, budget of real tokens: random samples until their real tokens fill the budget.

A step = forward, output projection of the real target positions, summed cross-entropy, backward.
Figures are target tokens per second; layouts alternate batch by batch and each batch's best step
is used, the median beside it (on a shared machine the best is the least disturbed). On CUDA (bf16 autocast)
the same layouts are timed with every backend that runs there, after the line saying what
``--attention auto`` picks there and why.

    .venv/bin/python benchmarks/attention.py            # ~1-2 minutes on 2 idle CPU cores
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from nmt.config import model_config
from nmt.model import Packing, TransformerModel, build_model
from nmt.model.attention import AttentionMask, attention, resolve_backend

PAD, BOS, NUM_SPECIALS = 0, 1, 4


@dataclass
class Batch:
    src_lengths: torch.Tensor  # (B,)
    tgt_lengths: torch.Tensor  # (B,)
    padded: tuple[
        torch.Tensor, torch.Tensor, torch.Tensor
    ]  # src (B, S), prev (B, T), target (B, T)
    packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # src (Ns,), prev (Nt,), target (Nt,)

    @property
    def num_target_tokens(self) -> int:
        return int(self.tgt_lengths.sum())


def multi30k_like_lengths(
    num_samples: int, *, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Source/target lengths (pieces + EOS): log-normal around 14, clipped to 3-40, correlated."""
    src = np.clip(np.round(rng.lognormal(np.log(13.0), 0.35, num_samples)), 3, 40).astype(np.int64)
    tgt = np.clip(np.round(src * rng.normal(1.05, 0.15, num_samples)), 3, 40).astype(np.int64)
    return src, tgt


def token_budget_batches(
    order: np.ndarray, src: np.ndarray, tgt: np.ndarray, *, max_tokens: int, padded: bool
) -> list[np.ndarray]:
    """Consecutive samples of ``order`` under ``max_tokens``: counted with padding (batch size x
    longest side, fairseq) or, for packed batches, as the sum of each sample's longer side."""
    batches, start, longest, total = [], 0, 0, 0
    for end, index in enumerate(order):
        side = max(src[index], tgt[index])
        cost = max(longest, side) * (end - start + 1) if padded else total + side
        if cost > max_tokens:
            batches.append(order[start:end])
            start, longest, total = end, 0, 0
        longest, total = max(longest, side), total + side
    batches.append(order[start:])
    return batches


def make_batch(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, *, vocab: int, device: torch.device
) -> Batch:
    src_len = torch.from_numpy(src_lengths)
    tgt_len = torch.from_numpy(tgt_lengths)
    src_valid = torch.arange(int(src_len.max())) < src_len[:, None]  # (B, S)
    tgt_valid = torch.arange(int(tgt_len.max())) < tgt_len[:, None]  # (B, T)
    src = torch.randint(NUM_SPECIALS, vocab, src_valid.shape).masked_fill(~src_valid, PAD)
    target = torch.randint(NUM_SPECIALS, vocab, tgt_valid.shape).masked_fill(~tgt_valid, PAD)
    prev = torch.cat([torch.full((target.shape[0], 1), BOS), target[:, :-1]], dim=1).masked_fill(
        ~tgt_valid, PAD
    )
    padded = tuple(t.to(device) for t in (src, prev, target))
    packed = tuple(
        t[valid].to(device)
        for t, valid in ((src, src_valid), (prev, tgt_valid), (target, tgt_valid))
    )
    return Batch(src_len.to(device), tgt_len.to(device), padded, packed)  # type: ignore[arg-type]


def train_step(model: TransformerModel, batch: Batch, *, packed: bool, autocast: bool) -> None:
    device_type = batch.src_lengths.device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        if packed:
            src, prev, target = batch.packed
            hidden = model(src, batch.src_lengths, prev, batch.tgt_lengths, packed=True)  # (Nt, D)
        else:
            src, prev, target = batch.padded
            hidden = model(src, batch.src_lengths, prev, batch.tgt_lengths)[
                target != PAD
            ]  # (Nt, D)
            target = target[target != PAD]
        logits = model.output_projection(hidden)  # (Nt, V): only real positions are projected
        loss = F.cross_entropy(logits.float(), target, reduction="sum")
    loss.backward()


def time_step(model: TransformerModel, batch: Batch, *, packed: bool, autocast: bool) -> float:
    synchronize = torch.cuda.synchronize if batch.src_lengths.is_cuda else (lambda: None)
    model.zero_grad(set_to_none=True)
    synchronize()
    start = time.perf_counter()
    train_step(model, batch, packed=packed, autocast=autocast)
    synchronize()
    return time.perf_counter() - start


def run_layouts(
    backend: str,
    *,
    device: torch.device,
    batches: dict[str, list[Batch]],
    repeats: int,
    autocast: bool,
    vocab: int,
) -> None:
    """Target tokens per second of each layout; layouts alternate batch by batch, so load from other
    processes on the machine falls on all of them alike (one warm-up pass is not timed)."""
    torch.manual_seed(0)
    cfg = model_config(
        "transformer_tiny",
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        pad_id=PAD,
        attention=backend,
    )
    model = build_model(cfg).to(device).train()
    layouts = [
        ("padded, random batches", "random", False),
        ("padded, length-sorted", "sorted", False),
        ("packed, same random batches", "random", True),
        ("packed, budget of real tokens", "packed", True),
    ]
    if backend == "varlen":  # varlen runs sdpa on padded batches: nothing new to time
        layouts = [layout for layout in layouts if layout[2]]
    num_batches = len(batches["random"])
    times = {name: np.zeros((repeats, num_batches)) for name, _, _ in layouts}  # seconds per step
    for repeat in range(-1, repeats):  # repeat -1 warms up
        for index in range(num_batches):
            for name, key, packed in layouts:
                seconds = time_step(model, batches[key][index], packed=packed, autocast=autocast)
                if repeat >= 0:
                    times[name][repeat, index] = seconds
    rows = []
    for name, key, packed in layouts:
        num_target = sum(b.num_target_tokens for b in batches[key])
        num_computed = num_target if packed else sum(b.padded[1].numel() for b in batches[key])
        # Each batch's best step is the one least disturbed by other load on a shared machine.
        best, median = times[name].min(axis=0).sum(), np.median(times[name], axis=0).sum()
        rows.append((name, num_target / best, num_target / median, num_target / num_computed))
    baseline = rows[0][1]
    for name, best, median, density in rows:
        print(
            f"  {backend:9s} {name:29s} {best:7.0f} tgt tok/s (median {median:6.0f})"
            f"   real/computed target tokens {density:4.2f}   speed x{best / baseline:4.2f}"
        )


def best_times(candidates: dict[str, Callable[[], None]], *, repeats: int) -> dict[str, float]:
    """Best seconds of each candidate; candidates alternate, so other load falls on all alike."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for repeat in range(repeats + 1):
        for name, run in candidates.items():
            start = time.perf_counter()
            run()
            if repeat > 0:
                times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def print_ratios(results: dict[str, float], *, baseline: str) -> None:
    for name, seconds in results.items():
        print(
            f"  {name:34s} {seconds * 1e3:7.2f} ms   speed x{results[baseline] / seconds:4.2f} vs {baseline}"
        )


def time_attention_forms(*, repeats: int) -> None:
    """The attention call alone (forward+backward): SDPA mask forms, and packed-layout strategies."""
    generator = torch.Generator().manual_seed(0)
    num_heads, head_dim = 4, 64
    lengths = torch.from_numpy(multi30k_like_lengths(120, rng=np.random.default_rng(0))[0])  # (B,)
    packing = Packing.from_lengths(lengths, num_tokens=int(lengths.sum()))
    num_samples, length = lengths.shape[0], packing.max_len
    print(
        f"\ncpu: attention call only, forward+backward (B={num_samples}, T={length}, H={num_heads}, Dh={head_dim})"
    )

    valid = (torch.arange(length) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    padded = [
        torch.randn(num_samples, num_heads, length, head_dim, generator=generator).requires_grad_()
        for _ in range(3)
    ]
    masks = {
        "bool (B,1,1,S)": valid,
        "bool (B,1,T,S) materialised": valid.expand(-1, 1, length, -1).contiguous(),
        "float additive (B,1,1,S)": torch.zeros(valid.shape).masked_fill(~valid, float("-inf")),
        "no mask (lower bound)": None,
    }
    print_ratios(
        best_times(
            {
                name: lambda m=mask: (
                    F.scaled_dot_product_attention(*padded, attn_mask=m).sum().backward()
                )
                for name, mask in masks.items()
            },
            repeats=repeats,
        ),
        baseline="bool (B,1,1,S)",
    )

    packed = [
        torch.randn(
            packing.positions.shape[0], num_heads, head_dim, generator=generator
        ).requires_grad_()
        for _ in range(3)
    ]
    gathered = AttentionMask("sdpa", key_lengths=lengths, q_packing=packing, kv_packing=packing)
    sample_of_token = torch.repeat_interleave(torch.arange(num_samples), lengths)  # (N,)
    same_sample = sample_of_token[:, None] == sample_of_token[None, :]  # (N, N)
    block_diagonal = torch.zeros(same_sample.shape).masked_fill(~same_sample, float("-inf"))
    as_one_sequence = [t.transpose(0, 1)[None] for t in packed]  # (1, H, N, Dh)
    print_ratios(
        best_times(
            {
                "packed, gather around SDPA (ours)": lambda: (
                    attention(*packed, gathered, dropout_p=0.0).sum().backward()
                ),
                "packed, dense block-diagonal mask": lambda: (
                    F.scaled_dot_product_attention(*as_one_sequence, attn_mask=block_diagonal)
                    .sum()
                    .backward()
                ),
                "padded input (no gather, bound)": lambda: (
                    F.scaled_dot_product_attention(
                        *padded, attn_mask=masks["float additive (B,1,1,S)"]
                    )
                    .sum()
                    .backward()
                ),
            },
            repeats=repeats,
        ),
        baseline="packed, gather around SDPA (ours)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--num-batches", type=int, default=4, help="distinct batches per layout")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the batches")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # nmt's one line per backend choice, --attention auto's with its reason, among the rows.
    logging.basicConfig(level=logging.INFO, format="  %(message)s")

    rng = np.random.default_rng(args.seed)
    src, tgt = multi30k_like_lengths(29_000, rng=rng)
    print(
        f"lengths: src mean {src.mean():.1f} (range {src.min()}-{src.max()}), "
        f"tgt mean {tgt.mean():.1f} (range {tgt.min()}-{tgt.max()}); max tokens {args.max_tokens}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    shuffled = rng.permutation(len(src))
    batchings = {
        "random": token_budget_batches(shuffled, src, tgt, max_tokens=args.max_tokens, padded=True),
        "sorted": token_budget_batches(
            np.lexsort((tgt, src)), src, tgt, max_tokens=args.max_tokens, padded=True
        ),
        "packed": token_budget_batches(
            shuffled, src, tgt, max_tokens=args.max_tokens, padded=False
        ),
    }
    # The last batch of a batching is a remainder: never picked.
    picks = {
        key: [batches[i] for i in rng.choice(len(batches) - 1, args.num_batches, replace=False)]
        for key, batches in batchings.items()
    }

    devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for device in devices:
        batches = {
            key: [make_batch(src[i], tgt[i], vocab=args.vocab, device=device) for i in indices]
            for key, indices in picks.items()
        }
        on_cuda = device.type == "cuda"
        print(
            f"\n{device.type}: transformer_tiny, one training step (fp32{' -> bf16 autocast' if on_cuda else ''})"
        )
        resolve_backend("auto", device_type=device.type)
        for backend in ("sdpa", "xformers", "varlen") if on_cuda else ("sdpa",):
            try:
                run_layouts(
                    backend,
                    device=device,
                    batches=batches,
                    repeats=args.repeats,
                    autocast=on_cuda,
                    vocab=args.vocab,
                )
            except ValueError as error:  # a backend that cannot run here (e.g. no xFormers)
                print(f"  {backend:9s} skipped: {error}")
    time_attention_forms(repeats=10)


if __name__ == "__main__":
    main()

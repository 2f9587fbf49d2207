"""Collate a list of (source ids, target ids) samples into padded or packed tensors.

Stored samples end with EOS; the decoder input is BOS + target[:-1], built here per sample.
Keys (B real samples, B' = max(B, pad_rows_to) rows; extra rows are empty samples of length 0):

padded: ``src_tokens`` (B', S), ``prev_output_tokens`` and ``target`` (B', T), pad_id where padded;
    ``src_lengths``/``tgt_lengths`` (B',). S and T are at least 1 (a batch of empty rows keeps a
    width) and at least ``pad_tokens_to``, rounded up to ``length_multiple``.
packed: ``src_tokens`` (Ns,), ``prev_output_tokens``/``target`` (Nt,); lengths (B',);
    ``src_cu_seqlens``/``tgt_cu_seqlens`` (B' + 1,) int32; ``src_positions``/``tgt_positions``
    (N,) int64 restarting at 0 per sample. N is at least ``pad_tokens_to``, rounded up to
    ``length_multiple``; tokens past cu_seqlens[-1] are padding (pad_id, position 0) and belong to
    no sample: attention must ignore them and the loss sees pad targets.
both: ``target_index`` (number of real target tokens,) int64: where the real target tokens lie in
    the flattened ``target`` (the loss is computed there only; an index made here, on the host,
    spares the device a boolean-mask selection, which would make the host wait for it).

Everything is computed with numpy on the host and handed over as tensors: nothing here reads a
tensor, so collating never waits for a device.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from nmt.data.packing import cu_seqlens_from_lengths, positions_from_lengths

LAYOUTS = ("padded", "packed")
Sample = tuple[np.ndarray, np.ndarray]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _flatten(samples: Sequence[Sample], side: int) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated tokens (N,) int64 and lengths (B,) of one side. The samples are checked one by
    one only when the concatenation is not 1-D integers: a check per sample was a third of
    collating a batch."""
    arrays = [np.asarray(sample[side]) for sample in samples]
    try:
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    except ValueError:  # arrays of different dimensions
        tokens = None
    if tokens is None or tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
        _check_samples(arrays, side)
    assert tokens is not None  # _check_samples raised otherwise
    lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    return tokens.astype(np.int64, copy=False), lengths


def _check_samples(arrays: Sequence[np.ndarray], side: int) -> None:
    """ValueError naming the first sample of ``side`` that is not a 1-D integer array (an empty
    one of any dtype passes)."""
    for i, array in enumerate(arrays):
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise ValueError(
                f"sample {i}: side {side} must be a 1-D integer array, got {array.dtype} {array.shape}"
            )


def shift_right(target: np.ndarray, lengths: np.ndarray, *, bos_id: int) -> np.ndarray:
    """Packed decoder input: per sample BOS + target[:-1] (same length as the target)."""
    prev = np.empty_like(target)
    prev[1:] = target[:-1]
    starts = (np.cumsum(lengths) - lengths)[lengths > 0]
    prev[starts] = bos_id
    return prev


def _padded_total(
    num_real: int, *, pad_to: int | None, multiple: int, name: str, minimum: int = 0
) -> int:
    if pad_to is not None and pad_to < num_real:
        raise ValueError(f"{name}={pad_to} is smaller than the batch needs ({num_real})")
    return _round_up(max(num_real, pad_to or 0, minimum), multiple)


def collate(
    samples: Sequence[Sample],
    *,
    pad_id: int = 0,
    bos_id: int = 1,
    layout: str = "padded",
    length_multiple: int = 1,
    pad_rows_to: int | None = None,
    pad_tokens_to: int | None = None,
) -> dict[str, torch.Tensor]:
    """Tensors for one batch (see the module doc for keys and shapes); ``samples`` may be empty."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if length_multiple < 1:
        raise ValueError(f"length_multiple must be >= 1, got {length_multiple}")
    num_rows = _padded_total(len(samples), pad_to=pad_rows_to, multiple=1, name="pad_rows_to")
    src, src_lengths = _flatten(samples, 0)
    tgt, tgt_lengths = _flatten(samples, 1)
    prev = shift_right(tgt, tgt_lengths, bos_id=bos_id)
    extra_rows = np.zeros(num_rows - len(samples), dtype=np.int64)
    lengths = {
        "src": np.concatenate([src_lengths, extra_rows]),
        "tgt": np.concatenate([tgt_lengths, extra_rows]),
    }
    tokens = {
        "src_tokens": ("src", src),
        "prev_output_tokens": ("tgt", prev),
        "target": ("tgt", tgt),
    }
    batch: dict[str, torch.Tensor] = {
        "src_lengths": torch.from_numpy(lengths["src"]),
        "tgt_lengths": torch.from_numpy(lengths["tgt"]),
    }
    num_target = int(tgt_lengths.sum())
    if layout == "packed":
        totals = {}
        for side in ("src", "tgt"):
            totals[side] = _padded_total(
                int(lengths[side].sum()),
                pad_to=pad_tokens_to,
                multiple=length_multiple,
                name="pad_tokens_to",
            )
            batch[f"{side}_cu_seqlens"] = torch.from_numpy(cu_seqlens_from_lengths(lengths[side]))
            batch[f"{side}_positions"] = torch.from_numpy(
                positions_from_lengths(lengths[side], total=totals[side])
            )
        for key, (side, flat) in tokens.items():
            out = np.full(totals[side], pad_id, dtype=np.int64)
            out[: flat.shape[0]] = flat
            batch[key] = torch.from_numpy(out)
        batch["target_index"] = torch.arange(num_target)
    else:
        widths = {
            side: _padded_total(
                int(lengths[side].max(initial=0)),
                pad_to=pad_tokens_to,
                multiple=length_multiple,
                name="pad_tokens_to",
                minimum=1,
            )
            for side in ("src", "tgt")
        }
        slots = {}  # flat (row * width + column) slot of every real token of a side
        for side in ("src", "tgt"):
            rows = np.repeat(np.arange(num_rows, dtype=np.int64), lengths[side])
            slots[side] = rows * widths[side] + positions_from_lengths(lengths[side])
        for key, (side, flat) in tokens.items():
            out = np.full(num_rows * widths[side], pad_id, dtype=np.int64)
            out[slots[side]] = flat
            batch[key] = torch.from_numpy(out.reshape(num_rows, widths[side]))
        batch["target_index"] = torch.from_numpy(slots["tgt"])
    return batch

"""One attention function over several backends, for padded and packed layouts.

Layouts (``H`` heads of ``Dh`` dims):

- padded: queries ``(B, T, H, Dh)``, keys/values ``(B, S, H, Dh)``, with per-sample lengths;
- packed: queries ``(Nt, H, Dh)``, keys/values ``(Ns, H, Dh)``: the samples' tokens back to back,
  described by a :class:`Packing` (lengths, ``cu_seqlens``, positions).

Backends (``--attention``):

- ``sdpa``: :func:`torch.nn.functional.scaled_dot_product_attention`. Padded: an additive float key
  mask ``(B, 1, 1, S)``, built once per batch in the query dtype (SDPA turns a boolean mask into this
  on every call; ``benchmarks/attention.py`` times the forms: all within noise on 2 CPU cores), and
  ``is_causal`` (no mask tensor) for decoder self-attention. Packed: the projections and FFN stay
  on packed tokens; queries/keys/values are gathered into a padded ``(B, T)`` view only around the
  attention call and the result is gathered back (dense block-diagonal masks over the packed
  sequence are ~10x slower on CPU, nested tensors fall back to a slow path without causal masks).
- ``xformers`` (CUDA only): ``xformers.ops.memory_efficient_attention``. Padded: a float bias of the
  exact ``(B, H, T, S)`` shape, expanded from aligned storage, or ``LowerTriangularMask``; packed
  (batch dimension 1): ``BlockDiagonalMask`` / ``BlockDiagonalCausalMask`` built once per batch.
- ``varlen`` (CUDA only, torch >= 2.11): ``torch.nn.attention.varlen.varlen_attn`` (Flash) on the
  packed layout at bf16/fp16 (``window_size=(-1, 0)`` is causal). It has no dropout argument.
  Padded batches, float32 and incremental decoding use ``sdpa``.
- ``auto``: on CUDA, ``varlen`` when it can run (no attention dropout), else ``xformers`` when
  xFormers runs, else ``sdpa`` (:func:`choose_auto` says why); ``sdpa`` elsewhere. One line logs the
  choice and, when xFormers does not run, which torch/xFormers pair does.

Fully padded rows (length-0 samples) would make a softmax over no keys: every key mask lets a
length-0 sample see its first key slot, so outputs and gradients stay finite (those rows carry no
loss, so the value they read does not matter).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nmt.device import move

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "xformers", "sdpa", "varlen")

# The newest xFormers and the torch its wheel is built for: xformers/cpp_lib.json in the wheel of
# `pip download --no-deps xformers==0.0.35` says "torch": "2.10.0+cu128", while its METADATA asks
# only torch>=2.10, so pip installs it beside a newer torch, where it imports and no kernel loads.
XFORMERS_MATCHED_PAIR = ("2.10.0", "0.0.35")  # (torch, xformers)
# Flash kernels (varlen) take half precision only.
FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Installed:
    """The versions the attention kernels depend on, read without importing xFormers."""

    torch: str  # torch.__version__
    varlen_problem: str | None  # why torch's varlen_attn cannot be used (None: it can)
    xformers: str | None  # the installed xFormers' version (None: not installed)
    xformers_torch: str | None  # the torch its wheel was built for (None: unknown)


@functools.cache
def installed_kernels() -> Installed:
    """Metadata and files only: importing a mismatched xFormers logs tracebacks of its own."""
    try:
        from torch.nn.attention.varlen import varlen_attn

        # torch 2.10's varlen_attn has is_causal where later ones have window_size (which we pass).
        has_window = "window_size" in inspect.signature(varlen_attn).parameters
        varlen_problem = None if has_window else "this torch's varlen_attn has no window_size"
    except ImportError:
        varlen_problem = "this torch has no torch.nn.attention.varlen"
    try:
        distribution = importlib.metadata.distribution("xformers")
    except importlib.metadata.PackageNotFoundError:
        return Installed(torch.__version__, varlen_problem, None, None)
    try:
        build = json.loads(Path(distribution.locate_file("xformers/cpp_lib.json")).read_text())
        built_for = str(build["version"]["torch"])
    except (OSError, ValueError, KeyError, TypeError):
        built_for = None  # a source build, or a layout we do not know: only the probe can tell
    return Installed(torch.__version__, varlen_problem, distribution.version, built_for)


def xformers_status(installed: Installed) -> str:
    """What the user has of xFormers, and which torch/xFormers pair runs it when that is not it."""
    pair_torch, pair_xformers = XFORMERS_MATCHED_PAIR
    if installed.xformers is None:
        state = "xFormers is not installed"
    elif installed.xformers_torch is None:
        state = f"xFormers {installed.xformers} is installed (built for an unknown torch)"
    elif _public(installed.xformers_torch) == _public(installed.torch):
        return f"xFormers {installed.xformers} is built for this torch {installed.torch}"
    else:
        state = (
            f"xFormers {installed.xformers} is built for torch {installed.xformers_torch}, "
            f"not this torch {installed.torch}"
        )
        pair_torch, pair_xformers = _public(installed.xformers_torch), installed.xformers
    return f"{state}; to run xFormers install torch=={pair_torch} with xformers=={pair_xformers}"


def _public(version: str) -> str:
    """2.10.0+cu128 -> 2.10.0 (a wheel's CUDA build is not part of the torch it matches)."""
    return version.split("+")[0]


def choose_auto(
    device_type: str,
    *,
    attention_dropout: float,
    installed: Installed,
    probe_xformers: Callable[[], str | None],
) -> tuple[str, str]:
    """(backend, why) for ``--attention auto``: a fixed order, varlen, then xFormers, then sdpa.

    Fixed rather than timed at start-up, so every rank and every resumed run computes with the same
    kernel. varlen first: on an H200 it matched SDPA's packed speed with 15-23% less memory
    (README), needs no other wheel, and no xFormers wheel matches the pinned torch.
    ``probe_xformers`` (it imports xFormers) is called only when varlen cannot run.
    """
    if device_type != "cuda":
        return "sdpa", "xFormers and varlen run on CUDA only"
    status = xformers_status(installed)
    if installed.varlen_problem is None and attention_dropout == 0.0:
        return "varlen", (
            "PyTorch's Flash kernel on packed batches at bf16/fp16, sdpa for the rest; "
            f"preferred to xFormers ({status})"
        )
    why_not_varlen = installed.varlen_problem or (
        f"varlen has no attention dropout (--attention-dropout {attention_dropout})"
    )
    problem = "not installed" if installed.xformers is None else probe_xformers()
    if problem is None:
        return "xformers", f"{why_not_varlen}; xFormers {installed.xformers} runs"
    return "sdpa", f"{why_not_varlen}; xFormers does not run ({problem}); {status}"


def probe_xformers(device: str) -> str | None:
    """Why xFormers' kernels do not run on ``device`` (None when they do). Importing is not
    enough: a wheel built for another torch imports, and fails at the first call."""
    xformers_logger = logging.getLogger("xformers")
    was_disabled, xformers_logger.disabled = xformers_logger.disabled, True
    try:
        import xformers.ops as xops

        probe = torch.zeros(1, 8, 1, 16, device=device, dtype=torch.float16)
        xops.memory_efficient_attention(probe, probe, probe)
    except Exception as error:  # any failure means "does not run", told to the user in one line
        message = str(error).strip().splitlines()
        return f"{type(error).__name__}: {message[0][:200] if message else ''}"
    finally:
        xformers_logger.disabled = was_disabled  # its warnings repeat our line with a traceback
    return None


@functools.cache
def _xformers_problem() -> str | None:
    """Why xFormers cannot run here (None when it can); imported only when CUDA is up."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return probe_xformers("cuda")


_RESOLVED: dict[tuple[str, str, float], str] = {}


# A plain dict cache rather than functools.cache: torch.compile runs a constant-result function
# once at trace time, but it traces into cache wrappers (and would break the graph at the log line).
@torch.compiler.assume_constant_result
def resolve_backend(name: str, *, device_type: str, attention_dropout: float = 0.0) -> str:
    """The backend that runs for ``--attention name`` on ``device_type``; logs the choice, and for
    ``auto`` why, in one line, once.

    Raises ValueError when an explicitly requested backend cannot run here (never falls back).
    """
    key = (name, device_type, attention_dropout)
    if key not in _RESOLVED:
        backend, why = _choose_backend(
            name, device_type=device_type, attention_dropout=attention_dropout
        )
        _RESOLVED[key] = backend
        logger.info(
            "attention backend: %s (--attention %s, device %s)%s",
            backend,
            name,
            device_type,
            f": {why}" if why else "",
        )
    return _RESOLVED[key]


def _choose_backend(name: str, *, device_type: str, attention_dropout: float) -> tuple[str, str]:
    if name not in BACKENDS:
        raise ValueError(f"--attention: must be one of {', '.join(BACKENDS)}, got {name!r}")
    on_cuda = device_type == "cuda"
    if name == "auto":
        return choose_auto(
            device_type,
            attention_dropout=attention_dropout,
            installed=installed_kernels(),
            probe_xformers=_xformers_problem,
        )
    if name == "xformers":
        problem = "the model is not on a CUDA device" if not on_cuda else _xformers_problem()
        if problem is not None:
            raise ValueError(
                f"--attention xformers cannot run: {problem} "
                f"({xformers_status(installed_kernels())}); use --attention auto"
            )
    if name == "varlen":
        if not on_cuda:
            raise ValueError(
                "--attention varlen needs a CUDA device (Flash Attention); use --attention sdpa"
            )
        if installed_kernels().varlen_problem is not None:
            raise ValueError(
                f"--attention varlen cannot run: {installed_kernels().varlen_problem} "
                "(torch >= 2.11 has it); use --attention auto"
            )
        if attention_dropout > 0.0:
            raise ValueError(
                "--attention varlen has no attention dropout; set --attention-dropout 0"
            )
    return name, ""


@dataclass
class Packing:
    """Where the tokens of each sample lie in a packed sequence, and the padded view of it.

    The packed sequence may end with a tail of padding tokens past ``cu_seqlens[-1]`` that belong
    to no sample (static shapes): no query sees them, and attention gives them zeros.

    ``pad`` gathers packed rows ``(N, ...)`` into a padded ``(B, T, ...)`` view (slots past a
    sample's length are zeros) and ``unpad`` gathers back, zeros for the tail. Each is the other's
    backward: every real token has exactly one padded slot, so both directions are gathers
    (``index_select``), where autograd's own backward of a gather is a scatter-add (on 2 CPU cores
    that scatter was 17% of a training step).
    """

    lengths: torch.Tensor  # (B,) int64
    cu_seqlens: torch.Tensor  # (B+1,) int32, starts of the samples and the total
    positions: torch.Tensor  # (N,) int64, position of each token within its sample (0 in the tail)
    seqlens: list[int]  # the lengths on the host (xFormers' block masks are built from them)
    num_real: int  # tokens that belong to a sample (cu_seqlens[-1]); N - num_real is the tail
    max_len: int  # T of the padded view (>= 1)
    scatter_index: torch.Tensor  # (num_real,) int64, padded slot b*T+t of each real token
    padding_index: torch.Tensor  # (B*T - num_real,) int64, the padded view's other slots

    @classmethod
    def from_lengths(
        cls,
        lengths: torch.Tensor,
        *,
        num_tokens: int,
        cu_seqlens: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> Packing:
        """Build from per-sample lengths (B,) and the packed length N (tail included);
        ``cu_seqlens`` (B+1,) and ``positions`` (N,) are derived when not given (collate makes both).
        Lengths in host memory are read as such; on a device, with one sync."""
        lengths = lengths.long()
        seqlens = lengths.numpy().tolist() if lengths.device.type == "cpu" else lengths.tolist()
        num_real = sum(seqlens)
        if num_real > num_tokens:
            raise ValueError(
                f"packed batch has {num_tokens} tokens but its lengths sum to {num_real}"
            )
        max_len = max(max(seqlens, default=0), 1)  # a batch of empty samples keeps a width
        # Every index from the host lengths, in numpy: no device work to know them, and no torch
        # operation on the host (each one costs its dispatch, on the update's critical path).
        host = np.asarray(seqlens, dtype=np.int64)
        within = _ranks_within(host)  # (num_real,) each token's position in its sample
        device = lengths.device
        if cu_seqlens is None:
            cu_seqlens = torch.from_numpy(np.cumsum(np.insert(host, 0, 0)).astype(np.int32))
        if positions is None:
            positions = torch.from_numpy(np.pad(within, (0, num_tokens - num_real)))  # (N,)
        row_starts = np.arange(host.shape[0], dtype=np.int64) * max_len
        scatter_index = torch.from_numpy(np.repeat(row_starts, host) + within)
        # Slots len_b .. T-1 of each row b.
        pad_counts = max_len - host
        padding_index = torch.from_numpy(
            np.repeat(row_starts + host, pad_counts) + _ranks_within(pad_counts)
        )
        cu_seqlens, positions = cu_seqlens.to(device), positions.to(device)
        scatter_index, padding_index = scatter_index.to(device), padding_index.to(device)
        return cls(
            lengths, cu_seqlens, positions, seqlens, num_real, max_len, scatter_index, padding_index
        )

    def to(self, device: torch.device) -> Packing:
        """The same packing with its tensors on ``device`` (asynchronous copies from pinned memory
        on CUDA); the host fields stay."""

        return Packing(
            move(self.lengths, device),
            move(self.cu_seqlens, device),
            move(self.positions, device),
            self.seqlens,
            self.num_real,
            self.max_len,
            move(self.scatter_index, device),
            move(self.padding_index, device),
        )

    @property
    def num_samples(self) -> int:
        return self.lengths.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...); padding slots are zeros."""
        return _Pad.apply(x, self).view(self.num_samples, self.max_len, *x.shape[1:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...), zeros for the tail."""
        return _Unpad.apply(x.reshape(-1, *x.shape[2:]), self)

    def _gather_padded(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B*T, ...) with zeros in padding slots: each real token written to its slot
        (measured faster than gathering from x with a zero row appended, which copies x first), and
        zeros written to the padding slots only."""
        padded = x.new_empty(self.num_samples * self.max_len, *x.shape[1:])
        padded[self.scatter_index] = x[: self.num_real]
        return padded.index_fill_(0, self.padding_index, 0.0)  # only the padding: a few percent

    def _gather_packed(self, x: torch.Tensor) -> torch.Tensor:
        """(B*T, ...) -> (N, ...): the real tokens' slots, zeros for the tail."""
        return self.zero_tail(x.index_select(0, self.scatter_index))

    def zero_tail(self, x: torch.Tensor) -> torch.Tensor:
        """(num_real, ...) -> (N, ...) with zero rows for the tail (no copy when there is none)."""
        num_tail = self.num_tokens - self.num_real
        return x if num_tail == 0 else torch.cat([x, x.new_zeros(num_tail, *x.shape[1:])])


def _ranks_within(counts: np.ndarray) -> np.ndarray:
    """(sum(counts),) int64: 0 .. count - 1 for each of the (B,) ``counts`` in turn."""
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts
    )


def unpack(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Packed rows (N, ...) of samples with ``lengths`` (B,) -> padded (B, T, ...), zeros as padding
    (a tail past the samples is dropped)."""
    packing = Packing.from_lengths(lengths, num_tokens=x.shape[0])
    return packing.pad(x)  # (B, T, ...)


class _Pad(torch.autograd.Function):
    """``Packing.pad`` with a gather as its backward (``_Unpad``'s forward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packing: Packing) -> torch.Tensor:  # type: ignore[override]
        ctx.packing = packing
        return packing._gather_padded(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return ctx.packing._gather_packed(grad), None


class _Unpad(torch.autograd.Function):
    """``Packing.unpad`` with a gather as its backward (``_Pad``'s forward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packing: Packing) -> torch.Tensor:  # type: ignore[override]
        ctx.packing = packing
        return packing._gather_packed(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return ctx.packing._gather_padded(grad), None


@dataclass
class AttentionMask:
    """Which keys each query sees in one kind of attention of one batch.

    Built once per batch (encoder self, decoder self, cross) and reused by every layer; the
    backend-specific forms (float masks, xFormers biases) are made on first use and cached.

    ``key_lengths`` None means every key is valid (incremental decoding self-attention).
    ``q_packing``/``kv_packing`` are set for the packed layout.
    """

    backend: str
    causal: bool = False
    key_lengths: torch.Tensor | None = None  # (B,) int64
    q_packing: Packing | None = None
    kv_packing: Packing | None = None
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def packed(self) -> bool:
        return self.q_packing is not None

    def index_select(self, index: torch.Tensor) -> AttentionMask:
        """Reorder/expand the batch of a padded mask (beam search)."""
        assert not self.packed, "incremental decoding runs on the padded layout"
        lengths = None if self.key_lengths is None else self.key_lengths.index_select(0, index)
        return AttentionMask(self.backend, causal=self.causal, key_lengths=lengths)

    def _key_valid(self, num_keys: int) -> torch.Tensor:
        """(B, S) bool; a length-0 sample keeps its first slot so no softmax row is empty."""
        assert self.key_lengths is not None
        slots = torch.arange(num_keys, device=self.key_lengths.device)
        return slots < self.key_lengths.clamp(min=1)[:, None]

    def sdpa_mask(self, *, num_keys: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Additive float key mask (B, 1, 1, S) in the query dtype, or None when none is needed."""
        if self.causal or self.key_lengths is None:
            return None
        key = ("sdpa", num_keys, dtype)
        if key not in self._cache:
            valid = self._key_valid(num_keys)[:, None, None, :]  # (B, 1, 1, S)
            self._cache[key] = torch.zeros(
                valid.shape, dtype=dtype, device=valid.device
            ).masked_fill_(~valid, float("-inf"))
        return self._cache[key]

    def xformers_bias(
        self, *, num_heads: int, num_queries: int, num_keys: int, dtype: torch.dtype
    ) -> Any:
        """The ``attn_bias`` for ``memory_efficient_attention`` (xformers imported by the caller)."""
        from xformers.ops import fmha

        key = ("xformers", num_heads, num_queries, num_keys, dtype)
        if key in self._cache:
            return self._cache[key]
        if self.packed:
            assert self.kv_packing is not None
            q_lens = self.q_packing.seqlens
            device = self.q_packing.lengths.device
            if self.causal:
                bias = fmha.attn_bias.BlockDiagonalCausalMask.from_seqlens(q_lens, device=device)
            else:
                bias = fmha.attn_bias.BlockDiagonalMask.from_seqlens(
                    q_lens, self.kv_packing.seqlens, device=device
                )
        elif self.causal:
            bias = fmha.attn_bias.LowerTriangularMask()
        elif self.key_lengths is None:
            bias = None
        else:
            # xFormers wants the exact (B, H, T, S) shape, and every stride but the last a multiple
            # of 16 bytes: slice the key axis out of storage rounded up to 8, expand the rest.
            valid = self._key_valid(num_keys)  # (B, S)
            aligned = 8 * math.ceil(num_keys / 8)
            storage = torch.zeros(valid.shape[0], 1, 1, aligned, dtype=dtype, device=valid.device)
            bias = storage[..., :num_keys]
            bias.masked_fill_(~valid[:, None, None, :], float("-inf"))
            bias = bias.expand(valid.shape[0], num_heads, num_queries, num_keys)
        self._cache[key] = bias
        return bias


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, dropout_p: float
) -> torch.Tensor:
    """Scaled dot-product attention; output has the layout and shape of ``q``.

    q: (B, T, H, Dh) padded or (Nt, H, Dh) packed; k, v: (B, S, H, Dh) or (Ns, H, Dh).
    """
    if mask.packed:
        return _packed_attention(q, k, v, mask, dropout_p=dropout_p)
    if mask.backend == "xformers":
        return _xformers(q, k, v, mask, dropout_p=dropout_p)
    return _sdpa(q, k, v, mask, dropout_p=dropout_p)


def self_attention(qkv: torch.Tensor, mask: AttentionMask, *, dropout_p: float) -> torch.Tensor:
    """Attention of one fused projection's queries, keys and values: qkv (B, T, 3, H, Dh) or
    (N, 3, H, Dh) -> (B, T, H, Dh) or (N, H, Dh). Packed for SDPA, the three are padded in one
    gather, not three."""
    if mask.packed and _runs_sdpa(mask, qkv.dtype):
        return _packed_sdpa_self(qkv, mask, dropout_p=dropout_p)
    q, k, v = qkv.unbind(-3)
    return attention(q, k, v, mask, dropout_p=dropout_p)


def cross_attention(
    q: torch.Tensor, kv: torch.Tensor, mask: AttentionMask, *, dropout_p: float
) -> torch.Tensor:
    """Attention over fused keys and values: q (B, T, H, Dh) or (Nt, H, Dh), kv (B, S, 2, H, Dh) or
    (Ns, 2, H, Dh). Packed for SDPA, the keys and values are padded in one gather."""
    if mask.packed and _runs_sdpa(mask, q.dtype):
        return _packed_sdpa_cross(q, kv, mask, dropout_p=dropout_p)
    k, v = kv.unbind(-3)
    return attention(q, k, v, mask, dropout_p=dropout_p)


def _runs_sdpa(mask: AttentionMask, dtype: torch.dtype) -> bool:
    """Whether a packed batch of a non-xFormers backend runs sdpa (varlen only runs Flash dtypes)."""
    return mask.backend == "sdpa" or (mask.backend == "varlen" and dtype not in FLASH_DTYPES)


# Eager under torch.compile, as _packed_attention: their inner shapes depend on the samples.
@torch.compiler.disable
def _packed_sdpa_self(qkv: torch.Tensor, mask: AttentionMask, *, dropout_p: float) -> torch.Tensor:
    assert mask.q_packing is not None
    q, k, v = mask.q_packing.pad(qkv).unbind(2)  # (B, T, H, Dh) each
    return mask.q_packing.unpad(_sdpa(q, k, v, mask, dropout_p=dropout_p))  # (N, H, Dh)


@torch.compiler.disable
def _packed_sdpa_cross(
    q: torch.Tensor, kv: torch.Tensor, mask: AttentionMask, *, dropout_p: float
) -> torch.Tensor:
    assert mask.q_packing is not None and mask.kv_packing is not None
    k, v = mask.kv_packing.pad(kv).unbind(2)  # (B, S, H, Dh) each
    out = _sdpa(mask.q_packing.pad(q), k, v, mask, dropout_p=dropout_p)
    return mask.q_packing.unpad(out)  # (Nt, H, Dh)


@torch.compiler.disable
def _packed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, dropout_p: float
) -> torch.Tensor:
    """Packed (N, H, Dh) attention. Eager under torch.compile: the shapes inside depend on the number
    of samples and the longest one, so the compiled graphs around it see token counts only."""
    if mask.backend == "xformers":
        return _xformers(q, k, v, mask, dropout_p=dropout_p)
    if not _runs_sdpa(mask, q.dtype):
        return _varlen(q, k, v, mask)
    assert mask.q_packing is not None and mask.kv_packing is not None
    out = _sdpa(
        mask.q_packing.pad(q),
        mask.kv_packing.pad(k),
        mask.kv_packing.pad(v),
        mask,
        dropout_p=dropout_p,
    )
    return mask.q_packing.unpad(out)  # (Nt, H, Dh)


def _sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, dropout_p: float
) -> torch.Tensor:
    """Padded SDPA: (B, T, H, Dh) x (B, S, H, Dh) -> (B, T, H, Dh)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),  # (B, H, T, Dh)
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask.sdpa_mask(num_keys=k.shape[1], dtype=q.dtype),
        dropout_p=dropout_p,
        is_causal=mask.causal,
    )  # (B, H, T, Dh)
    return out.transpose(1, 2)


def _xformers(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, *, dropout_p: float
) -> torch.Tensor:
    import xformers.ops as xops

    # xFormers takes (batch, tokens, heads, head dim): the padded layout as is, packed as batch 1
    # without the tail (the block-diagonal masks cover the samples' tokens only).
    if mask.packed:
        assert mask.q_packing is not None and mask.kv_packing is not None
        q = q[: mask.q_packing.num_real].unsqueeze(0)
        k = k[: mask.kv_packing.num_real].unsqueeze(0)
        v = v[: mask.kv_packing.num_real].unsqueeze(0)
    bias = mask.xformers_bias(
        num_heads=q.shape[2], num_queries=q.shape[1], num_keys=k.shape[1], dtype=q.dtype
    )
    out = xops.memory_efficient_attention(q, k, v, attn_bias=bias, p=dropout_p)
    return mask.q_packing.zero_tail(out.squeeze(0)) if mask.q_packing is not None else out


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    assert mask.q_packing is not None and mask.kv_packing is not None
    num_q, num_kv = mask.q_packing.num_real, mask.kv_packing.num_real
    out = varlen_attn(
        q[:num_q],
        k[:num_kv],
        v[:num_kv],
        mask.q_packing.cu_seqlens,
        mask.kv_packing.cu_seqlens,
        mask.q_packing.max_len,
        mask.kv_packing.max_len,
        window_size=(-1, 0) if mask.causal else (-1, -1),
    )
    return mask.q_packing.zero_tail(out)

"""Encoder-decoder transformer ("Attention is all you need") with fairseq's knobs.

Token conventions (``cfg.pad_id`` is all the model needs): source = pieces + EOS, decoder input
``prev_output_tokens`` = BOS + target[:-1], target = pieces + EOS.

Two layouts share every weight and give the same results (to float tolerance):

- padded: ``src_tokens (B, S)``, ``prev_output_tokens (B, T)`` with lengths ``(B,)``;
- packed: ``src_tokens (Ns,)``, ``prev_output_tokens (Nt,)``, samples back to back, with lengths
  ``(B,)`` and optionally ``cu_seqlens (B+1,)`` int32 and positions ``(N,)`` restarting at 0 per
  sample (derived from the lengths when not given). The packed tensors may end with a tail of
  padding tokens past ``cu_seqlens[-1]`` (static shapes): they belong to no sample, no query sees
  them, and their outputs are finite (mask them out of the loss). :func:`nmt.model.unpack` restores
  the padded view of a packed output.

The forward returns the final decoder states (after the final layer norm when pre-norm); the
vocabulary projection is the separate ``model.output_projection`` so a trainer can project only the
real target positions.

Incremental decoding (beam search)::

    enc = model.encode(src_tokens, src_lengths)          # padded
    state = model.init_decoder_state(enc)                # cross-attention keys/values, once
    state.reorder(torch.arange(B).repeat_interleave(beam))   # expand to B*beam rows
    logits = model.decode_step(tokens, state)            # (B*beam,) -> (B*beam, V); state advances
    state.reorder(index)                                 # after choosing the surviving beams
    state.reorder_beams(index)                           # beams moved within their sentences only

Alignments: inside ``with model.recording_cross_attention() as weights:`` every padded forward or
decoding step appends the last decoder layer's head-averaged cross-attention (B, T, S) to ``weights``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nmt.config import ModelConfig, from_dict, option_name
from nmt.model.attention import (
    AttentionMask,
    Packing,
    attention,
    cross_attention,
    resolve_backend,
    self_attention,
)


def _embedding(num_embeddings: int, dim: int, *, pad_id: int) -> nn.Embedding:
    """fairseq's init: N(0, dim^-0.5), padding row zero (and kept zero: no gradient)."""
    embedding = nn.Embedding(num_embeddings, dim, padding_idx=pad_id)
    nn.init.normal_(embedding.weight, mean=0.0, std=dim**-0.5)
    with torch.no_grad():
        embedding.weight[pad_id].zero_()
    return embedding


def _linear(in_dim: int, out_dim: int, *, num_chunks: int = 1, gain: float = 1.0) -> nn.Linear:
    """Xavier-uniform weight (per chunk, so a fused projection inits like its separate parts), zero bias."""
    linear = nn.Linear(in_dim, out_dim)
    for chunk in linear.weight.detach().chunk(num_chunks, dim=0):
        nn.init.xavier_uniform_(chunk, gain=gain)
    nn.init.zeros_(linear.bias)
    return linear


class _CpuDropout(torch.autograd.Function):
    """Inverted dropout whose keep-mask comes from 16-bit halves of 32-bit random draws.

    ``F.dropout`` on CPU draws one Bernoulli sample per element, which made dropout ~12% of a
    training step of the tiny model; two 16-bit uniforms per 32-bit draw cost a fifth of that. The
    drop probability is rounded to a multiple of 2^-16 and the scale uses that rounded value, so
    the expectation stays exact. Seeded by torch's global generator like ``F.dropout``.
    """

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, p: float
    ) -> torch.Tensor:  # type: ignore[override]
        num_dropped_levels = round(p * 65536)
        draws = torch.randint(-(2**31), 2**31 - 1, ((x.numel() + 1) // 2,), dtype=torch.int32)
        uniform16 = draws.view(torch.int16)  # uniform over [-2^15, 2^15)
        if uniform16.shape[0] != x.numel():  # an odd count leaves a half unused (a slice less)
            uniform16 = uniform16[: x.numel()]
        uniform16 = uniform16.view(x.shape)
        scale = 65536.0 / (65536 - num_dropped_levels)
        # The mask as x's dtype with the scale folded in: one multiplication each way (a boolean
        # mask is converted to x's dtype by every multiplication, and the scale is a second pass).
        # Kept, as x's dtype, times the scale: 3 operations, a where between two 0-d tensors' 4.
        mask = (uniform16 >= num_dropped_levels - 32768).to(x.dtype).mul_(scale)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``F.dropout``, with a cheaper mask on CPU (CUDA's fused kernel is already fast)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training)
    return _CpuDropout.apply(x, p)


class KeyBiasFreeLinear(nn.Linear):
    """A fused projection (QKV or KV) whose key chunk has no bias.

    A key bias adds ``q . b`` to every score of a query, a constant that softmax removes: its
    gradient is exactly zero in theory and float noise in practice, and Adam normalises that noise
    into full-size steps, so runs that differ only in summation order (1 rank x 2 accumulation
    steps vs 2 ranks) drift apart. Masking the key chunk keeps it at zero with an exact zero
    gradient; the state dict keeps the usual ``weight``/``bias`` layout.
    """

    def __init__(
        self, in_dim: int, out_dim: int, *, num_chunks: int, key_chunk: int, gain: float
    ) -> None:
        super().__init__(in_dim, out_dim)
        for chunk in self.weight.detach().chunk(num_chunks, dim=0):
            nn.init.xavier_uniform_(chunk, gain=gain)
        nn.init.zeros_(self.bias)
        mask = torch.ones(out_dim)
        mask.view(num_chunks, -1)[key_chunk] = 0.0
        self.register_buffer("bias_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias * self.bias_mask)


def sinusoidal_table(
    num_positions: int, dim: int, *, formula: str = "fairseq", offset: int = 0
) -> torch.Tensor:
    """Sinusoids (num_positions, dim) for positions ``offset, offset + 1, ...``: sines first, then
    cosines. fairseq's frequencies are 10000^(-i / (dim/2 - 1)); Marian's (and transformers'
    MarianMT's) 10000^(-2i / dim), computed in float64 as transformers does, so the tables match."""
    if formula == "marian":
        positions = torch.arange(offset, offset + num_positions, dtype=torch.float64)[:, None]
        freqs = 10000.0 ** (-2.0 * torch.arange((dim + 1) // 2, dtype=torch.float64) / dim)
        angles = positions * freqs[None, :]  # (P, ceil(dim/2))
        return torch.cat([angles.sin(), angles[:, : dim // 2].cos()], dim=1).float()
    half = dim // 2
    freqs = torch.exp(
        torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1))
    )
    positions = torch.arange(offset, offset + num_positions, dtype=torch.float)
    angles = positions[:, None] * freqs[None, :]  # (P, half)
    table = torch.cat([angles.sin(), angles.cos()], dim=1)
    return F.pad(table, (0, dim - 2 * half))  # an odd dim gets a zero column


class Embedder(nn.Module):
    """Scaled token embeddings + positional embeddings + dropout."""

    def __init__(
        self,
        tokens: nn.Embedding,
        *,
        max_positions: int,
        learned_pos: bool,
        scale: bool,
        dropout: float,
        sinusoids: str = "fairseq",
        position_offset: int = 0,
    ) -> None:
        super().__init__()
        dim = tokens.embedding_dim
        self.tokens = tokens
        self.scale = math.sqrt(dim) if scale else 1.0
        self.dropout = dropout
        if learned_pos:
            self.positions = nn.Parameter(torch.randn(max_positions, dim) * dim**-0.5)
        else:
            # Not persistent: rebuilt from the config, so checkpoints carry no constant tables.
            table = sinusoidal_table(max_positions, dim, formula=sinusoids, offset=position_offset)
            self.register_buffer("positions", table, persistent=False)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) or (N,); positions (T,) broadcast over the batch, or (N,) -> (..., D)."""
        x = self.tokens(tokens) * self.scale + F.embedding(positions, self.positions)
        return dropout(x, self.dropout, self.training)


class _Attention(nn.Module):
    """What self- and cross-attention share: heads, the attention call, the output projection."""

    def __init__(self, dim: int, num_heads: int, *, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.dropout = dropout
        self.out_proj = _linear(dim, dim)

    @property
    def dropout_p(self) -> float:
        return self.dropout if self.training else 0.0

    def _project_out(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H, Dh) -> (..., D)."""
        return self.out_proj(out.flatten(-2))


@dataclass
class KVCache:
    """Self-attention keys/values of the decoded prefix: (B, t, H, Dh) each."""

    keys: torch.Tensor
    values: torch.Tensor

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add one step (B, 1, H, Dh); returns the whole prefix."""
        self.keys = torch.cat([self.keys, k], dim=1)
        self.values = torch.cat([self.values, v], dim=1)
        return self.keys, self.values

    def reorder(self, index: torch.Tensor) -> None:
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)


class SelfAttention(_Attention):
    """Self-attention with one fused QKV projection (one GEMM instead of three)."""

    def __init__(self, dim: int, num_heads: int, *, dropout: float) -> None:
        super().__init__(dim, num_heads, dropout=dropout)
        # fairseq scales q/k/v init by 1/sqrt(2) when they share the input dim.
        self.qkv_proj = KeyBiasFreeLinear(dim, 3 * dim, num_chunks=3, key_chunk=1, gain=2**-0.5)

    def forward(
        self, x: torch.Tensor, mask: AttentionMask, *, cache: KVCache | None = None
    ) -> torch.Tensor:
        """x (B, T, D) or (N, D); with ``cache``, x is one step (B, 1, D) and the cache grows."""
        qkv = self.qkv_proj(x).unflatten(-1, (3, self.num_heads, self.head_dim))  # (..., 3, H, Dh)
        if cache is None:
            return self._project_out(self_attention(qkv, mask, dropout_p=self.dropout_p))
        q, k, v = qkv.unbind(-3)  # (B, 1, H, Dh) each
        k, v = cache.append(k, v)
        return self._project_out(attention(q, k, v, mask, dropout_p=self.dropout_p))


class CrossAttention(_Attention):
    """Decoder-to-encoder attention; keys/values come from ``project_kv`` (once per batch)."""

    def __init__(self, dim: int, num_heads: int, *, encoder_dim: int, dropout: float) -> None:
        super().__init__(dim, num_heads, dropout=dropout)
        gain = 2**-0.5 if encoder_dim == dim else 1.0  # fairseq's rule (qkv_same_dim)
        self.q_proj = _linear(dim, dim, gain=gain)
        self.kv_proj = KeyBiasFreeLinear(encoder_dim, 2 * dim, num_chunks=2, key_chunk=0, gain=gain)

    def project_kv(self, encoder_out: torch.Tensor) -> torch.Tensor:
        """(B, S, De) or (Ns, De) -> keys and values (..., 2, H, Dh), fused."""
        return self.kv_proj(encoder_out).unflatten(-1, (2, self.num_heads, self.head_dim))

    def forward(self, x: torch.Tensor, kv: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))  # (..., H, Dh)
        return self._project_out(cross_attention(q, kv, mask, dropout_p=self.dropout_p))

    def weights(self, x: torch.Tensor, k: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        """Attention probabilities averaged over heads, (B, T, S), for queries x (B, T, D) over keys
        k (B, S, H, Dh) (padded layout). The attention kernels never materialise them, so they are
        recomputed here, only when asked for (alignments)."""
        assert not mask.packed, "attention weights are recorded on the padded layout"
        q = (
            self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
        )  # (B, H, T, Dh)
        scores = q @ k.permute(0, 2, 3, 1) * self.head_dim**-0.5  # (B, H, T, S)
        bias = mask.sdpa_mask(num_keys=k.shape[1], dtype=scores.dtype)  # (B, 1, 1, S) or None
        if bias is not None:
            scores = scores + bias
        return scores.softmax(dim=-1).mean(dim=1)


class FeedForward(nn.Module):
    def __init__(
        self, dim: int, ffn_dim: int, *, activation_fn: str, activation_dropout: float
    ) -> None:
        super().__init__()
        self.fc1 = _linear(dim, ffn_dim)
        self.fc2 = _linear(ffn_dim, dim)
        self.activation = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}[activation_fn]
        self.activation_dropout = activation_dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = dropout(self.activation(self.fc1(x)), self.activation_dropout, self.training)
        return self.fc2(hidden)


class Residual(nn.Module):
    """A sublayer with its residual connection, dropout and layer norm (pre- or post-norm)."""

    def __init__(self, dim: int, *, normalize_before: bool, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.normalize_before = normalize_before
        self.dropout = dropout

    def forward(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.normalize_before:
            return x + dropout(sublayer(self.norm(x)), self.dropout, self.training)
        return self.norm(x + dropout(sublayer(x), self.dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim = cfg.encoder_embed_dim
        residual = dict(normalize_before=cfg.encoder_normalize_before, dropout=cfg.dropout)
        self.self_attn = SelfAttention(
            dim, cfg.encoder_attention_heads, dropout=cfg.attention_dropout
        )
        self.self_attn_block = Residual(dim, **residual)
        self.ffn = FeedForward(
            dim,
            cfg.encoder_ffn_embed_dim,
            activation_fn=cfg.activation_fn,
            activation_dropout=cfg.activation_dropout,
        )
        self.ffn_block = Residual(dim, **residual)

    def forward(self, x: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        x = self.self_attn_block(x, lambda h: self.self_attn(h, mask))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dim = cfg.decoder_embed_dim
        heads = cfg.decoder_attention_heads
        residual = dict(normalize_before=cfg.decoder_normalize_before, dropout=cfg.dropout)
        self.self_attn = SelfAttention(dim, heads, dropout=cfg.attention_dropout)
        self.self_attn_block = Residual(dim, **residual)
        self.cross_attn = CrossAttention(
            dim, heads, encoder_dim=cfg.encoder_embed_dim, dropout=cfg.attention_dropout
        )
        self.cross_attn_block = Residual(dim, **residual)
        self.ffn = FeedForward(
            dim,
            cfg.decoder_ffn_embed_dim,
            activation_fn=cfg.activation_fn,
            activation_dropout=cfg.activation_dropout,
        )
        self.ffn_block = Residual(dim, **residual)

    def forward(
        self,
        x: torch.Tensor,
        *,
        self_mask: AttentionMask,
        cross_kv: torch.Tensor,
        cross_mask: AttentionMask,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        x = self.self_attn_block(x, lambda h: self.self_attn(h, self_mask, cache=cache))
        x = self.cross_attn_block(x, lambda h: self.cross_attn(h, cross_kv, cross_mask))
        return self.ffn_block(x, self.ffn)


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed = Embedder(
            tokens,
            max_positions=cfg.max_source_positions,
            learned_pos=cfg.encoder_learned_pos,
            scale=not cfg.no_scale_embedding,
            dropout=cfg.dropout,
            sinusoids=cfg.sinusoidal_positions,
            position_offset=cfg.position_offset,
        )
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.final_norm = (
            nn.LayerNorm(cfg.encoder_embed_dim) if cfg.encoder_normalize_before else None
        )

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: AttentionMask
    ) -> torch.Tensor:
        """tokens (B, S) or (Ns,) -> encoder states (B, S, De) or (Ns, De)."""
        x = self.embed(tokens, positions)
        for layer in self.layers:
            x = layer(x, mask)
        return x if self.final_norm is None else self.final_norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed = Embedder(
            tokens,
            max_positions=cfg.max_target_positions,
            learned_pos=cfg.decoder_learned_pos,
            scale=not cfg.no_scale_embedding,
            dropout=cfg.dropout,
            sinusoids=cfg.sinusoidal_positions,
            position_offset=cfg.position_offset,
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.final_norm = (
            nn.LayerNorm(cfg.decoder_embed_dim) if cfg.decoder_normalize_before else None
        )
        self.start_id = cfg.decoder_start_id

    def project_cross_kv(self, encoder_out: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's cross-attention keys and values (..., 2, H, Dh) from the encoder states."""
        return [layer.cross_attn.project_kv(encoder_out) for layer in self.layers]

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        self_mask: AttentionMask,
        cross_kv: list[torch.Tensor],
        cross_mask: AttentionMask,
        caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """tokens (B, T) or (Nt,) -> decoder states (B, T, D) or (Nt, D)."""
        if self.start_id is not None:  # the first input (BOS, position 0) reads another token's row
            tokens = torch.where(positions == 0, self.start_id, tokens)
        x = self.embed(tokens, positions)
        for index, layer in enumerate(self.layers):
            cache = None if caches is None else caches[index]
            x = layer(
                x, self_mask=self_mask, cross_kv=cross_kv[index], cross_mask=cross_mask, cache=cache
            )
        return x if self.final_norm is None else self.final_norm(x)


@dataclass
class EncoderOut:
    """Padded encoder output for incremental decoding."""

    states: torch.Tensor  # (B, S, De)
    mask: AttentionMask  # source key mask (B rows)

    def index_select(self, index: torch.Tensor) -> EncoderOut:
        """Reorder/expand the batch: index (B',) of rows."""
        return EncoderOut(self.states.index_select(0, index), self.mask.index_select(index))

    def repeat_interleave(self, num_repeats: int) -> EncoderOut:
        """Each sample ``num_repeats`` times in a row (beams of one sentence are adjacent)."""
        rows = torch.arange(self.states.shape[0], device=self.states.device)
        return self.index_select(rows.repeat_interleave(num_repeats))


@dataclass
class DecoderState:
    """Everything a decoding step needs; ``reorder`` keeps all of it aligned with the beams."""

    cross_kv: list[torch.Tensor]  # per layer, keys and values (B, S, 2, H, Dh)
    cross_mask: AttentionMask
    self_caches: list[KVCache]  # per layer
    self_mask: AttentionMask  # all cached keys are visible to the one new query
    num_steps: int = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Select/expand batch rows in place (``index_select`` over batch*beam on every cache)."""
        self.cross_kv = [kv.index_select(0, index) for kv in self.cross_kv]
        self.cross_mask = self.cross_mask.index_select(index)
        self.reorder_beams(index)

    def reorder_beams(self, index: torch.Tensor) -> None:
        """Reorder rows that only move among the beams of their own sentence: the encoder side is the
        same for every beam of a sentence, so only the self-attention caches are copied (saves copying
        every layer's cross-attention keys/values at every step)."""
        for cache in self.self_caches:
            cache.reorder(index)


@dataclass
class PackedMasks:
    """A packed batch's three attention masks, made from the two sides' packings (each mask caches
    its backend's tensors for every layer)."""

    backend: str
    src: Packing
    tgt: Packing
    encoder: AttentionMask = field(init=False)
    decoder_self: AttentionMask = field(init=False)
    cross: AttentionMask = field(init=False)

    def __post_init__(self) -> None:
        src, tgt = self.src, self.tgt
        self.encoder = AttentionMask(
            self.backend, key_lengths=src.lengths, q_packing=src, kv_packing=src
        )
        self.decoder_self = AttentionMask(
            self.backend, causal=True, key_lengths=tgt.lengths, q_packing=tgt, kv_packing=tgt
        )
        self.cross = AttentionMask(
            self.backend, key_lengths=src.lengths, q_packing=tgt, kv_packing=src
        )

    @property
    def src_positions(self) -> torch.Tensor:  # (Ns,)
        return self.src.positions

    @property
    def tgt_positions(self) -> torch.Tensor:  # (Nt,)
        return self.tgt.positions

    def to(self, device: torch.device) -> PackedMasks:
        """The same masks with their index tensors on ``device`` (built on the host, where the
        sizes they need are known without reading the device)."""
        return PackedMasks(self.backend, self.src.to(device), self.tgt.to(device))


@torch.compiler.disable
def packed_masks(
    backend: str,
    src_lengths: torch.Tensor,
    tgt_lengths: torch.Tensor,
    *,
    num_src: int,
    num_tgt: int,
    src_cu_seqlens: torch.Tensor | None,
    tgt_cu_seqlens: torch.Tensor | None,
    src_positions: torch.Tensor | None = None,
    tgt_positions: torch.Tensor | None = None,
) -> PackedMasks:
    """A packed batch's masks, built from the per-sample lengths (and the offsets and positions
    collate already made, when given). A compiled model gets them from outside (``masks=``): their
    sizes vary with the number of samples, and the compiled graphs must see token counts only (a
    tensor argument of varying size would be a recompile)."""
    src = Packing.from_lengths(
        src_lengths, num_tokens=num_src, cu_seqlens=src_cu_seqlens, positions=src_positions
    )
    tgt = Packing.from_lengths(
        tgt_lengths, num_tokens=num_tgt, cu_seqlens=tgt_cu_seqlens, positions=tgt_positions
    )
    return PackedMasks(backend, src, tgt)


class TransformerModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        encoder_tokens = _embedding(cfg.src_vocab_size, cfg.encoder_embed_dim, pad_id=cfg.pad_id)
        decoder_tokens = (
            encoder_tokens
            if cfg.share_all_embeddings
            else _embedding(cfg.tgt_vocab_size, cfg.decoder_embed_dim, pad_id=cfg.pad_id)
        )
        self.encoder = Encoder(cfg, encoder_tokens)
        self.decoder = Decoder(cfg, decoder_tokens)
        self.output_projection = nn.Linear(
            cfg.decoder_embed_dim, cfg.tgt_vocab_size, bias=cfg.output_bias
        )
        if cfg.output_bias:
            nn.init.zeros_(self.output_projection.bias)
        if cfg.share_all_embeddings or cfg.share_decoder_input_output_embed:
            self.output_projection.weight = decoder_tokens.weight
        else:
            nn.init.normal_(
                self.output_projection.weight, mean=0.0, std=cfg.decoder_embed_dim**-0.5
            )

    def backend(self, device: torch.device) -> str:
        """The attention backend that runs on ``device`` (resolved and logged once)."""
        return resolve_backend(
            self.cfg.attention,
            device_type=device.type,
            attention_dropout=self.cfg.attention_dropout,
        )

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor | None,
        prev_output_tokens: torch.Tensor,
        tgt_lengths: torch.Tensor | None,
        *,
        packed: bool = False,
        src_positions: torch.Tensor | None = None,
        tgt_positions: torch.Tensor | None = None,
        src_cu_seqlens: torch.Tensor | None = None,
        tgt_cu_seqlens: torch.Tensor | None = None,
        masks: PackedMasks | None = None,
    ) -> torch.Tensor:
        """Teacher-forced decoder states.

        Padded: src_tokens (B, S), prev_output_tokens (B, T), lengths (B,) -> (B, T, D); positions
        and cu_seqlens are not used (decoder self-attention is causal, so only the source lengths
        matter). Packed: src_tokens (Ns,), prev_output_tokens (Nt,), lengths (B,) -> (Nt, D); with
        ``masks`` (see ``packed_masks``) the lengths and cu_seqlens are not read.
        Length-0 samples are allowed (finite outputs, zero gradient from them).
        """
        backend = self.backend(src_tokens.device)
        if not packed:
            encoder_out = self.encode(src_tokens, src_lengths)
            positions = torch.arange(
                prev_output_tokens.shape[1], device=prev_output_tokens.device
            )  # (T,)
            return self.decoder(
                prev_output_tokens,
                positions,
                self_mask=AttentionMask(backend, causal=True),
                cross_kv=self.decoder.project_cross_kv(encoder_out.states),
                cross_mask=encoder_out.mask,
            )
        if masks is None:
            masks = packed_masks(
                backend,
                src_lengths,
                tgt_lengths,
                num_src=src_tokens.shape[0],
                num_tgt=prev_output_tokens.shape[0],
                src_cu_seqlens=src_cu_seqlens,
                tgt_cu_seqlens=tgt_cu_seqlens,
                src_positions=src_positions,
                tgt_positions=tgt_positions,
            )
        encoder_states = self.encoder(src_tokens, masks.src_positions, masks.encoder)  # (Ns, De)
        return self.decoder(
            prev_output_tokens,
            masks.tgt_positions,
            self_mask=masks.decoder_self,
            cross_kv=self.decoder.project_cross_kv(encoder_states),
            cross_mask=masks.cross,
        )  # (Nt, D)

    def encode(self, src_tokens: torch.Tensor, src_lengths: torch.Tensor) -> EncoderOut:
        """Padded source (B, S), lengths (B,) -> encoder states and the source key mask."""
        mask = AttentionMask(self.backend(src_tokens.device), key_lengths=src_lengths)
        positions = torch.arange(src_tokens.shape[1], device=src_tokens.device)  # (S,)
        return EncoderOut(self.encoder(src_tokens, positions, mask), mask)

    def init_decoder_state(self, encoder_out: EncoderOut) -> DecoderState:
        """Start incremental decoding: cross-attention keys/values computed once here."""
        states = encoder_out.states
        num_samples = states.shape[0]
        caches = [
            KVCache(
                states.new_empty(
                    num_samples, 0, layer.self_attn.num_heads, layer.self_attn.head_dim
                ),
                states.new_empty(
                    num_samples, 0, layer.self_attn.num_heads, layer.self_attn.head_dim
                ),
            )
            for layer in self.decoder.layers
        ]
        return DecoderState(
            cross_kv=self.decoder.project_cross_kv(states),
            cross_mask=encoder_out.mask,
            self_caches=caches,
            self_mask=AttentionMask(encoder_out.mask.backend),
        )

    def decode_step(self, tokens: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Next-token logits (B, V) after feeding ``tokens`` (B,) at the current step; advances ``state``."""
        positions = torch.full(
            (1,), state.num_steps, dtype=torch.long, device=tokens.device
        )  # (1,)
        hidden = self.decoder(
            tokens[:, None],
            positions,
            self_mask=state.self_mask,
            cross_kv=state.cross_kv,
            cross_mask=state.cross_mask,
            caches=state.self_caches,
        )  # (B, 1, D)
        state.num_steps += 1
        return self.output_projection(hidden[:, 0])

    @contextlib.contextmanager
    def recording_cross_attention(self) -> Iterator[list[torch.Tensor]]:
        """Inside the block, every padded forward (teacher-forced, or one ``decode_step``) appends the
        last decoder layer's cross-attention probabilities averaged over heads, (B, T, S), to the
        yielded list (fairseq's alignment layer). A hook on that one module: the default path pays
        nothing, and no forward signature changes."""
        recorded: list[torch.Tensor] = []
        cross_attn = self.decoder.layers[-1].cross_attn

        def record(
            module: CrossAttention,
            args: tuple[torch.Tensor, torch.Tensor, AttentionMask],
        ) -> None:
            x, kv, mask = args
            recorded.append(module.weights(x, kv[..., 0, :, :], mask))

        handle = cross_attn.register_forward_pre_hook(record)
        try:
            yield recorded
        finally:
            handle.remove()


def build_model(cfg: ModelConfig) -> TransformerModel:
    """The model for ``cfg`` (weights initialised as fairseq does)."""
    return TransformerModel(cfg)


def load_model(state: dict[str, Any], *, name: str, target: str = "this nmt") -> TransformerModel:
    """The model a checkpoint's ``state`` holds (its ``model_config`` and ``model`` weights), on the
    CPU in eval mode, for every reader of checkpoints (decoding, export, scoring). Its attention
    backend is the device's choice: decoding runs on the padded layout, and a model trained with
    --attention varlen or xformers on a GPU must still decode on a CPU. A model option this nmt
    does not know (a newer model's) is refused, naming ``target`` (an export format), rather than
    ignored; ``name`` (the checkpoint) is named in each error."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(state["model_config"]) - known)
    if unknown:
        raise ValueError(
            f"{name}: model option {option_name(unknown[0])} is not supported by {target}"
        )
    cfg = dataclasses.replace(from_dict(ModelConfig, state["model_config"]), attention="auto")
    model = build_model(cfg)
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:
        raise ValueError(
            f"{name}: weights do not match the checkpoint's model config ({str(error).splitlines()[0]})"
        ) from None
    return model.eval()

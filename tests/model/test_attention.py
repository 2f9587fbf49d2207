"""The attention function against a plain reference, packing helpers, backend choice."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from nmt.model.attention import (
    AttentionMask,
    Packing,
    _xformers_problem,
    attention,
    resolve_backend,
    unpack,
)

NUM_HEADS, HEAD_DIM = 2, 8


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool
) -> torch.Tensor:
    """One sample, no padding: q (T, H, Dh), k/v (S, H, Dh) -> (T, H, Dh); empty keys give zeros."""
    if k.shape[0] == 0:
        return torch.zeros_like(q)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])  # (H, T, S)
    if causal:
        future = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v)


def random_lengths(num_samples: int, *, low: int, high: int, seed: int) -> torch.Tensor:
    return torch.randint(
        low, high + 1, (num_samples,), generator=torch.Generator().manual_seed(seed)
    )


def padded_qkv(lengths: torch.Tensor, *, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(
        lengths.shape[0], int(lengths.max()), NUM_HEADS, HEAD_DIM, generator=generator
    )


@pytest.mark.parametrize("causal", [False, True])
def test_padded_sdpa_matches_reference_outputs_and_grads(causal: bool) -> None:
    q_lengths = random_lengths(6, low=1, high=9, seed=0)
    kv_lengths = q_lengths if causal else random_lengths(6, low=1, high=11, seed=1)
    q = padded_qkv(q_lengths, seed=2).requires_grad_()
    k = padded_qkv(kv_lengths, seed=3).requires_grad_()
    v = padded_qkv(kv_lengths, seed=4).requires_grad_()
    mask = AttentionMask("sdpa", causal=causal, key_lengths=kv_lengths)
    out = attention(q, k, v, mask, dropout_p=0.0)  # (B, T, H, Dh)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    # Only real query positions count (padded queries' outputs are never used).
    q_valid = (torch.arange(q.shape[1]) < q_lengths[:, None])[..., None, None]
    (out * weights * q_valid).sum().backward()

    for b, (num_q, num_kv) in enumerate(zip(q_lengths.tolist(), kv_lengths.tolist())):
        qb, kb, vb = (
            t.detach()[b, :n].requires_grad_() for t, n in ((q, num_q), (k, num_kv), (v, num_kv))
        )
        expected = reference_attention(qb, kb, vb, causal=causal)
        torch.testing.assert_close(out[b, :num_q], expected, atol=1e-5, rtol=1e-5)
        (expected * weights[b, :num_q]).sum().backward()
        torch.testing.assert_close(q.grad[b, :num_q], qb.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k.grad[b, :num_kv], kb.grad, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v.grad[b, :num_kv], vb.grad, atol=1e-5, rtol=1e-5)
        # Padding keys get no gradient: they were never looked at.
        assert k.grad[b, num_kv:].abs().sum() == 0 and v.grad[b, num_kv:].abs().sum() == 0


@pytest.mark.parametrize("causal", [False, True])
def test_packed_sdpa_matches_reference(causal: bool) -> None:
    q_lengths = torch.tensor([3, 1, 6, 2])
    kv_lengths = q_lengths if causal else torch.tensor([5, 2, 1, 7])
    q_packing = Packing.from_lengths(q_lengths, num_tokens=int(q_lengths.sum()))
    kv_packing = Packing.from_lengths(kv_lengths, num_tokens=int(kv_lengths.sum()))
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(int(q_lengths.sum()), NUM_HEADS, HEAD_DIM, generator=generator)
    k, v = torch.randn(2, int(kv_lengths.sum()), NUM_HEADS, HEAD_DIM, generator=generator)
    mask = AttentionMask(
        "sdpa", causal=causal, key_lengths=kv_lengths, q_packing=q_packing, kv_packing=kv_packing
    )
    out = attention(q, k, v, mask, dropout_p=0.0)  # (Nt, H, Dh)
    expected = torch.cat(
        [
            reference_attention(qb, kb, vb, causal=causal)
            for qb, kb, vb in zip(
                q.split(q_lengths.tolist()),
                k.split(kv_lengths.tolist()),
                v.split(kv_lengths.tolist()),
            )
        ]
    )
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_empty_samples_give_finite_outputs_and_grads(packed: bool) -> None:
    lengths = torch.tensor([4, 0, 2, 0])
    if packed:
        packing = Packing.from_lengths(lengths, num_tokens=6)
        q, k, v = (torch.randn(6, NUM_HEADS, HEAD_DIM, requires_grad=True) for _ in range(3))
        masks = [
            AttentionMask(
                "sdpa", causal=causal, key_lengths=lengths, q_packing=packing, kv_packing=packing
            )
            for causal in (False, True)
        ]
    else:
        q, k, v = (torch.randn(4, 4, NUM_HEADS, HEAD_DIM, requires_grad=True) for _ in range(3))
        masks = [
            AttentionMask("sdpa", causal=causal, key_lengths=lengths) for causal in (False, True)
        ]
    for mask in masks:
        out = attention(q, k, v, mask, dropout_p=0.0)
        out.square().sum().backward()
        assert torch.isfinite(out).all()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_packing_round_trip_and_positions() -> None:
    lengths = torch.tensor([2, 0, 3, 1])
    packing = Packing.from_lengths(lengths, num_tokens=6)
    assert (
        packing.cu_seqlens.tolist() == [0, 2, 2, 5, 6] and packing.cu_seqlens.dtype == torch.int32
    )
    assert packing.positions.tolist() == [0, 1, 0, 1, 2, 0]
    x = torch.arange(6.0)[:, None] + 1  # (N, 1)
    torch.testing.assert_close(packing.unpad(packing.pad(x)), x)
    assert unpack(x, lengths)[..., 0].tolist() == [[1, 2, 0], [0, 0, 0], [3, 4, 5], [6, 0, 0]]
    # Given cu_seqlens (as collate passes them) are used as is.
    given = Packing.from_lengths(lengths, num_tokens=6, cu_seqlens=packing.cu_seqlens)
    assert torch.equal(given.scatter_index, packing.scatter_index)
    with pytest.raises(ValueError, match="lengths sum to 6"):
        Packing.from_lengths(lengths, num_tokens=5)


def test_packing_with_padding_tail() -> None:
    """Collate pads a packed batch to a static length: tokens past cu_seqlens[-1] are no sample's."""
    lengths = torch.tensor([2, 3])
    packing = Packing.from_lengths(lengths, num_tokens=8)
    assert (packing.num_real, packing.num_tokens) == (5, 8)
    assert packing.positions.tolist() == [0, 1, 0, 1, 2, 0, 0, 0]
    x = torch.arange(8.0)[:, None] + 1  # (N, 1)
    assert packing.unpad(packing.pad(x))[:, 0].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert unpack(x, lengths)[..., 0].tolist() == [[1, 2, 0], [3, 4, 5]]

    # Tail keys are seen by no query; tail queries get zeros.
    q, k, v = (torch.randn(8, NUM_HEADS, HEAD_DIM) for _ in range(3))
    mask = AttentionMask("sdpa", key_lengths=lengths, q_packing=packing, kv_packing=packing)
    out = attention(q, k, v, mask, dropout_p=0.0)
    k[5:], v[5:] = 1e3, 1e3
    torch.testing.assert_close(attention(q, k, v, mask, dropout_p=0.0), out)
    assert out[5:].abs().sum() == 0


def test_backend_choice_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="nmt.model.attention"):
        # A dropout no other test uses: a first resolution, however the tests are ordered.
        assert resolve_backend("auto", device_type="cpu", attention_dropout=0.125) == "sdpa"
        assert resolve_backend("auto", device_type="cpu", attention_dropout=0.125) == "sdpa"
    assert [r.getMessage() for r in caplog.records] == [
        "attention backend: sdpa (--attention auto, device cpu)"
    ]
    with pytest.raises(ValueError, match="--attention xformers cannot run"):
        resolve_backend("xformers", device_type="cpu")
    with pytest.raises(ValueError, match="--attention varlen needs a CUDA device"):
        resolve_backend("varlen", device_type="cpu")
    with pytest.raises(ValueError, match="--attention"):
        resolve_backend("flash", device_type="cpu")


def _xformers_usable() -> bool:
    # nmt's own probe: a wheel built for another torch imports, then fails at the first call
    return torch.cuda.is_available() and _xformers_problem() is None


cuda = pytest.mark.cuda


def xformers(test):
    """CUDA and a working xFormers."""
    return cuda(pytest.mark.skipif(not _xformers_usable(), reason="needs xFormers")(test))


def _compare_with_sdpa(backend: str, *, packed: bool, causal: bool) -> None:
    """A CUDA backend against sdpa on the same bf16 inputs, outputs and input grads."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    q_lengths = torch.tensor([5, 17, 1, 9], device=device)
    kv_lengths = q_lengths if causal else torch.tensor([12, 3, 8, 20], device=device)
    generator = torch.Generator(device).manual_seed(0)
    if packed:
        q_packing = Packing.from_lengths(q_lengths, num_tokens=int(q_lengths.sum()))
        kv_packing = Packing.from_lengths(kv_lengths, num_tokens=int(kv_lengths.sum()))
        q_shape = (int(q_lengths.sum()), 4, 64)
        kv_shape = (int(kv_lengths.sum()), 4, 64)
        packings = dict(q_packing=q_packing, kv_packing=kv_packing)
    else:
        q_shape = (4, int(q_lengths.max()), 4, 64)
        kv_shape = (4, int(kv_lengths.max()), 4, 64)
        packings = {}
    q = torch.randn(q_shape, device=device, dtype=dtype, generator=generator)
    k, v = (
        torch.randn(kv_shape, device=device, dtype=dtype, generator=generator) for _ in range(2)
    )
    results = []
    for name in (backend, "sdpa"):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        mask = AttentionMask(name, causal=causal, key_lengths=kv_lengths, **packings)
        out = attention(*inputs, mask, dropout_p=0.0)
        if not packed:  # padded queries' outputs are unspecified
            out = (
                out
                * (torch.arange(q_shape[1], device=device) < q_lengths[:, None])[..., None, None]
            )
        out.float().square().sum().backward()
        results.append((out, *(t.grad for t in inputs)))
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


@xformers
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_xformers_matches_sdpa(packed: bool, causal: bool) -> None:
    _compare_with_sdpa("xformers", packed=packed, causal=causal)


@cuda
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_sdpa(causal: bool) -> None:
    _compare_with_sdpa("varlen", packed=True, causal=causal)


def test_pad_and_unpad_are_exact_gathers_both_ways() -> None:
    """pad/unpad run a gather forward and backward; their gradients equal those of building the
    padded view token by token (a tail of 2 static-shape tokens belongs to no sample)."""
    lengths = torch.tensor([2, 0, 3, 1])
    packing = Packing.from_lengths(lengths, num_tokens=8)
    x = torch.randn(8, 3, requires_grad=True)
    weight = torch.randn(4, 3, 3)  # (B, T, D)
    reference_x = x.detach().clone().requires_grad_(True)
    starts = [0, 2, 2, 5]

    def reference_pad(rows: torch.Tensor) -> torch.Tensor:
        zero = rows.new_zeros(3)
        return torch.stack(
            [
                torch.stack([rows[starts[b] + t] if t < lengths[b] else zero for t in range(3)])
                for b in range(4)
            ]
        )

    padded = packing.pad(x)
    torch.testing.assert_close(padded, reference_pad(reference_x.detach()))
    (padded * weight).sum().backward()
    (reference_pad(reference_x) * weight).sum().backward()
    torch.testing.assert_close(x.grad, reference_x.grad)
    assert x.grad[6:].abs().sum() == 0  # the tail gets no gradient

    y = torch.randn(4, 3, 3, requires_grad=True)
    reference_y = y.detach().clone().requires_grad_(True)
    out_weight = torch.randn(8, 3)
    (packing.unpad(y) * out_weight).sum().backward()
    rows = [reference_y[b, t] for b in range(4) for t in range(int(lengths[b]))]
    reference_out = torch.cat([torch.stack(rows), reference_y.new_zeros(2, 3)])
    (reference_out * out_weight).sum().backward()
    torch.testing.assert_close(y.grad, reference_y.grad)

"""The attention function against a plain reference, packing helpers, backend choice."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import types
from pathlib import Path

import pytest
import torch

from nmt.model import attention as attention_module
from nmt.model.attention import (
    AttentionMask,
    Installed,
    Packing,
    _xformers_problem,
    attention,
    choose_auto,
    cross_attention,
    resolve_backend,
    self_attention,
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
        "attention backend: sdpa (--attention auto, device cpu): xFormers and varlen run on CUDA only"
    ]
    with pytest.raises(ValueError, match="--attention xformers cannot run"):
        resolve_backend("xformers", device_type="cpu")
    with pytest.raises(ValueError, match="--attention varlen needs a CUDA device"):
        resolve_backend("varlen", device_type="cpu")
    with pytest.raises(ValueError, match="--attention"):
        resolve_backend("flash", device_type="cpu")


TORCH_2_13 = "2.13.0+cu130"
XFORMERS_FOR_2_10 = dict(xformers="0.0.35", xformers_torch="2.10.0+cu128")


class Probe:
    """A stand-in for the xFormers probe that counts its calls (it imports xFormers: lazily)."""

    def __init__(self, problem: str | None) -> None:
        self.problem, self.calls = problem, 0

    def __call__(self) -> str | None:
        self.calls += 1
        return self.problem


def test_auto_prefers_varlen_then_xformers_then_sdpa() -> None:
    runs, fails = Probe(None), Probe("NotImplementedError: No operator found")
    newest = Installed(TORCH_2_13, None, **XFORMERS_FOR_2_10)
    # No attention dropout on a torch with varlen: varlen, and xFormers is not even imported.
    backend, why = choose_auto(
        "cuda", attention_dropout=0.0, installed=newest, probe_xformers=fails
    )
    assert backend == "varlen" and fails.calls == 0
    assert "install torch==2.10.0 with xformers==0.0.35" in why
    # Attention dropout rules varlen out: xFormers when its kernels run, else sdpa with the pair.
    assert choose_auto("cuda", attention_dropout=0.1, installed=newest, probe_xformers=runs) == (
        "xformers",
        "varlen has no attention dropout (--attention-dropout 0.1); xFormers 0.0.35 runs",
    )
    backend, why = choose_auto(
        "cuda", attention_dropout=0.1, installed=newest, probe_xformers=fails
    )
    assert (backend, why) == (
        "sdpa",
        "varlen has no attention dropout (--attention-dropout 0.1); xFormers does not run "
        "(NotImplementedError: No operator found); xFormers 0.0.35 is built for torch "
        "2.10.0+cu128, not this torch 2.13.0+cu130; "
        "to run xFormers install torch==2.10.0 with xformers==0.0.35",
    )
    # The matched pair (torch 2.10: no window_size in varlen) runs xFormers; its line names no pair.
    matched = Installed(
        "2.10.0+cu128", "this torch's varlen_attn has no window_size", **XFORMERS_FOR_2_10
    )
    assert choose_auto("cuda", attention_dropout=0.0, installed=matched, probe_xformers=runs)[
        0
    ] == ("xformers")
    backend, why = choose_auto(
        "cuda", attention_dropout=0.0, installed=matched, probe_xformers=fails
    )
    assert backend == "sdpa" and "xFormers 0.0.35 is built for this torch" in why
    assert "install" not in why
    # Not installed: never probed, and the line names the newest matched pair.
    absent, probe = Installed("2.10.0", "no varlen", None, None), Probe(None)
    backend, why = choose_auto(
        "cuda", attention_dropout=0.0, installed=absent, probe_xformers=probe
    )
    assert backend == "sdpa" and probe.calls == 0
    assert why.endswith(
        "xFormers is not installed; to run xFormers install torch==2.10.0 with xformers==0.0.35"
    )
    assert choose_auto("cpu", attention_dropout=0.0, installed=newest, probe_xformers=probe)[0] == (
        "sdpa"
    )
    assert probe.calls == 0


@pytest.fixture
def fake_xformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """xFormers 0.0.35 built for torch 2.10 as pip installs it beside a newer torch: its
    distribution metadata and build file on sys.path, a module in sys.modules that imports, and
    kernels that fail at the first call (logging a warning with a traceback, as xFormers does)."""
    dist_info = tmp_path / "xformers-0.0.35.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.35\n")
    (tmp_path / "xformers").mkdir()
    (tmp_path / "xformers" / "cpp_lib.json").write_text(
        json.dumps({"version": {"cuda": 1208, "torch": "2.10.0+cu128", "python": "3.10.19"}})
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def memory_efficient_attention(*args: object, **kwargs: object) -> None:
        logging.getLogger("xformers").warning("WARNING[XFORMERS]: xFormers can't load C++/CUDA")
        raise NotImplementedError(
            "No operator found for `memory_efficient_attention_forward` with inputs:\n"
            "     query       : shape=(1, 8, 1, 16) (torch.float16)"
        )

    package, ops = types.ModuleType("xformers"), types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = memory_efficient_attention  # type: ignore[attr-defined]
    package.ops = ops  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "xformers", package)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)
    return package


def test_a_mismatched_xformers_falls_back_in_one_line(
    fake_xformers: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    installed = attention_module.installed_kernels.__wrapped__()  # the fake's metadata, uncached
    assert (installed.xformers, installed.xformers_torch) == ("0.0.35", "2.10.0+cu128")
    assert attention_module.probe_xformers("cpu") == (
        "NotImplementedError: No operator found for `memory_efficient_attention_forward` with inputs:"
    )
    # The choice on a CUDA machine with this torch (attention dropout rules varlen out, so xFormers
    # is probed: on the CPU here, as CUDA is what this machine lacks, not what is under test).
    monkeypatch.setattr(
        attention_module,
        "installed_kernels",
        lambda: dataclasses.replace(installed, torch=TORCH_2_13),
    )
    monkeypatch.setattr(
        attention_module, "_xformers_problem", lambda: attention_module.probe_xformers("cpu")
    )
    monkeypatch.setattr(attention_module, "_RESOLVED", {})
    with caplog.at_level(logging.INFO):
        assert resolve_backend("auto", device_type="cuda", attention_dropout=0.1) == "sdpa"
        assert resolve_backend("auto", device_type="cuda", attention_dropout=0.1) == "sdpa"
    assert [r.getMessage() for r in caplog.records] == [
        "attention backend: sdpa (--attention auto, device cuda): varlen has no attention dropout "
        "(--attention-dropout 0.1); xFormers does not run (NotImplementedError: No operator found "
        "for `memory_efficient_attention_forward` with inputs:); xFormers 0.0.35 is built for "
        "torch 2.10.0+cu128, not this torch 2.13.0+cu130; to run xFormers install torch==2.10.0 "
        "with xformers==0.0.35"
    ]
    with pytest.raises(ValueError) as error:
        resolve_backend("xformers", device_type="cuda")
    assert str(error.value).startswith("--attention xformers cannot run: NotImplementedError")
    assert str(error.value).endswith("with xformers==0.0.35); use --attention auto")


def test_explicit_varlen_on_a_torch_without_its_window_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.10's varlen_attn takes is_causal, not window_size: --attention varlen says so."""
    torch_2_10 = Installed(
        "2.10.0+cu128", "this torch's varlen_attn has no window_size", None, None
    )
    monkeypatch.setattr(attention_module, "installed_kernels", lambda: torch_2_10)
    monkeypatch.setattr(attention_module, "_RESOLVED", {})
    with pytest.raises(ValueError) as error:
        resolve_backend("varlen", device_type="cuda")
    assert str(error.value) == (
        "--attention varlen cannot run: this torch's varlen_attn has no window_size "
        "(torch >= 2.11 has it); use --attention auto"
    )


def test_installed_kernels_without_xformers_or_its_build_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = attention_module.installed_kernels.__wrapped__()
    assert installed.torch == torch.__version__ and installed.varlen_problem is None  # torch 2.13
    # A source build has no cpp_lib.json: the torch it was built for is unknown.
    dist_info = tmp_path / "xformers-0.0.36.dev0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: xformers\nVersion: 0.0.36.dev0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = attention_module.installed_kernels.__wrapped__()
    assert (installed.xformers, installed.xformers_torch) == ("0.0.36.dev0", None)
    assert attention_module.xformers_status(installed) == (
        "xFormers 0.0.36.dev0 is installed (built for an unknown torch); "
        "to run xFormers install torch==2.10.0 with xformers==0.0.35"
    )


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_at_float32_runs_sdpa(causal: bool) -> None:
    """Flash takes bf16/fp16 only: a float32 packed batch of --attention varlen (auto's choice on
    CUDA) runs sdpa, here on the CPU where varlen_attn would fail."""
    lengths = torch.tensor([3, 1, 6, 2])
    packing = Packing.from_lengths(lengths, num_tokens=14)  # a tail of 2 tokens
    qkv = torch.randn(14, 3, NUM_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    kv = qkv[:, 1:]
    outputs = {}
    for backend in ("varlen", "sdpa"):
        mask = AttentionMask(
            backend, causal=causal, key_lengths=lengths, q_packing=packing, kv_packing=packing
        )
        outputs[backend] = (
            self_attention(qkv, mask, dropout_p=0.0),
            cross_attention(qkv[:, 0], kv, mask, dropout_p=0.0),
            attention(*qkv.unbind(1), mask, dropout_p=0.0),
        )
    torch.testing.assert_close(outputs["varlen"], outputs["sdpa"], atol=0, rtol=0)


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


@cuda
@pytest.mark.parametrize("packed", [False, True])
def test_auto_on_cuda_runs_and_matches_sdpa(packed: bool) -> None:
    """Whatever auto picks on this GPU's torch and xFormers runs, and computes what sdpa does."""
    backend = resolve_backend("auto", device_type="cuda")
    _compare_with_sdpa(backend, packed=packed, causal=True)


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

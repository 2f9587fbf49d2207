"""The encoder-decoder model: layouts, masking, incremental decoding, presets, init."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from nmt.config import ModelConfig, model_config
from nmt.model import TransformerModel, build_model, unpack

from ..helpers import tiny_model_config

PAD, BOS, EOS = 0, 1, 2
VOCAB = 50


def small_config(**overrides: object) -> ModelConfig:
    """Tiny dims so the whole file runs in seconds on 2 CPU cores."""
    return tiny_model_config(VOCAB, **{"attention": "sdpa", **overrides})


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) padded with PAD
    src_lengths: torch.Tensor  # (B,)
    prev: torch.Tensor  # (B, T) BOS + target[:-1], padded
    tgt_lengths: torch.Tensor  # (B,)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Ns,), (Nt,) tokens back to back."""
        src_valid = torch.arange(self.src.shape[1]) < self.src_lengths[:, None]
        tgt_valid = torch.arange(self.prev.shape[1]) < self.tgt_lengths[:, None]
        return self.src[src_valid], self.prev[tgt_valid]

    @property
    def tgt_valid(self) -> torch.Tensor:
        return torch.arange(self.prev.shape[1]) < self.tgt_lengths[:, None]  # (B, T)


def make_batch(src_lengths: list[int], tgt_lengths: list[int], *, seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    src_len, tgt_len = torch.tensor(src_lengths), torch.tensor(tgt_lengths)
    src = torch.randint(3, VOCAB, (len(src_lengths), max(src_lengths)), generator=generator)
    src[torch.arange(src.shape[1]) >= src_len[:, None]] = PAD
    prev = torch.randint(3, VOCAB, (len(tgt_lengths), max(tgt_lengths)), generator=generator)
    prev[:, 0] = BOS
    prev[torch.arange(prev.shape[1]) >= tgt_len[:, None]] = PAD
    return Batch(src, src_len, prev, tgt_len)


def random_batch(num_samples: int, *, seed: int, with_empty: bool = False) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    src_lengths = torch.randint(1, 12, (num_samples,), generator=generator).tolist()
    tgt_lengths = torch.randint(1, 12, (num_samples,), generator=generator).tolist()
    if with_empty:  # a dummy row, as the trainer adds for static shapes
        src_lengths[1] = tgt_lengths[1] = 0
    return make_batch(src_lengths, tgt_lengths, seed=seed)


def seeded_model(cfg: ModelConfig, seed: int = 0) -> TransformerModel:
    torch.manual_seed(seed)
    return build_model(cfg)


def loss_and_grads(
    model: TransformerModel, hidden: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    logits = model.output_projection(hidden)
    loss = logits.float().log_softmax(-1)[..., 3].sum()  # any fixed function of the real positions
    model.zero_grad()
    loss.backward()
    return loss.detach(), {
        name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None
    }


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("learned_pos", [False, True])
def test_packed_matches_padded_outputs_and_grads(normalize_before: bool, learned_pos: bool) -> None:
    cfg = small_config(
        encoder_normalize_before=normalize_before,
        decoder_normalize_before=normalize_before,
        encoder_learned_pos=learned_pos,
        decoder_learned_pos=learned_pos,
    )
    model = seeded_model(cfg)
    batch = random_batch(7, seed=1, with_empty=True)
    padded = model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)  # (B, T, D)
    padded_loss, padded_grads = loss_and_grads(model, padded[batch.tgt_valid])

    src_packed, prev_packed = batch.packed()
    packed = model(
        src_packed, batch.src_lengths, prev_packed, batch.tgt_lengths, packed=True
    )  # (Nt, D)
    packed_loss, packed_grads = loss_and_grads(model, packed)

    torch.testing.assert_close(
        unpack(packed, batch.tgt_lengths)[batch.tgt_valid], padded[batch.tgt_valid]
    )
    torch.testing.assert_close(packed_loss, padded_loss)
    assert packed_grads.keys() == padded_grads.keys()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_with_padding_tail_matches_padded() -> None:
    """The collate's static-shape tail (pad tokens past cu_seqlens[-1], position 0) changes nothing."""
    model = seeded_model(small_config())
    batch = random_batch(5, seed=10, with_empty=True)
    padded = model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)
    padded_loss, padded_grads = loss_and_grads(model, padded[batch.tgt_valid])

    src_packed, prev_packed = batch.packed()
    src_tail = torch.cat([src_packed, torch.full((3,), PAD)])  # (Ns + 3,)
    prev_tail = torch.cat([prev_packed, torch.full((7,), PAD)])  # (Nt + 7,)
    packed = model(
        src_tail, batch.src_lengths, prev_tail, batch.tgt_lengths, packed=True
    )  # (Nt + 7, D)
    assert packed.shape[0] == prev_tail.shape[0] and torch.isfinite(packed).all()
    packed_loss, packed_grads = loss_and_grads(model, packed[: prev_packed.shape[0]])
    torch.testing.assert_close(packed_loss, padded_loss)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_uses_given_positions_and_cu_seqlens() -> None:
    model = seeded_model(small_config()).eval()
    batch = random_batch(4, seed=2)
    src_packed, prev_packed = batch.packed()

    def layout(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).int()
        positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
        return cu_seqlens, positions

    src_cu, src_pos = layout(batch.src_lengths)
    tgt_cu, tgt_pos = layout(batch.tgt_lengths)
    derived = model(src_packed, batch.src_lengths, prev_packed, batch.tgt_lengths, packed=True)
    given = model(
        src_packed,
        batch.src_lengths,
        prev_packed,
        batch.tgt_lengths,
        packed=True,
        src_positions=src_pos,
        tgt_positions=tgt_pos,
        src_cu_seqlens=src_cu,
        tgt_cu_seqlens=tgt_cu,
    )
    torch.testing.assert_close(given, derived)
    shifted = model(
        src_packed,
        batch.src_lengths,
        prev_packed,
        batch.tgt_lengths,
        packed=True,
        tgt_positions=tgt_pos + 1,
    )
    assert not torch.allclose(shifted, derived)


def test_padded_and_future_tokens_change_nothing() -> None:
    model = seeded_model(small_config()).eval()
    batch = make_batch([3, 6], [4, 5], seed=3)
    reference = model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)

    src = batch.src.clone()
    src[0, 3:] = 7  # source padding of sample 0
    changed = model(src, batch.src_lengths, batch.prev, batch.tgt_lengths)
    torch.testing.assert_close(changed[batch.tgt_valid], reference[batch.tgt_valid])

    prev = batch.prev.clone()
    prev[1, 3] = 9  # a future target token for positions 0..2 of sample 1
    changed = model(batch.src, batch.src_lengths, prev, batch.tgt_lengths)
    torch.testing.assert_close(changed[1, :3], reference[1, :3])
    assert not torch.allclose(changed[1, 3], reference[1, 3])
    torch.testing.assert_close(changed[0], reference[0])  # other samples are untouched


@pytest.mark.parametrize("normalize_before", [False, True])
def test_incremental_decoding_equals_full_forward(normalize_before: bool) -> None:
    cfg = small_config(
        encoder_normalize_before=normalize_before, decoder_normalize_before=normalize_before
    )
    model = seeded_model(cfg).eval()
    batch = make_batch([5, 2, 7], [6, 6, 6], seed=4)
    beam = 2
    with torch.no_grad():
        full = model.output_projection(
            model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)
        )
        encoder_out = model.encode(batch.src, batch.src_lengths).repeat_interleave(beam)
        state = model.init_decoder_state(encoder_out)
        # Beams of a sentence are adjacent; a reorder that swaps them must move every cache along.
        swap = torch.arange(3 * beam).view(3, beam).flip(1).reshape(-1)
        prev = batch.prev.repeat_interleave(beam, dim=0)  # (B*beam, T)
        expected = full.repeat_interleave(beam, dim=0)  # (B*beam, T, V)
        for step in range(prev.shape[1]):
            logits = model.decode_step(prev[:, step], state)  # (B*beam, V)
            torch.testing.assert_close(logits, expected[:, step], atol=1e-5, rtol=1e-5)
            state.reorder(swap)
            prev, expected = prev[swap], expected[swap]


@pytest.mark.parametrize("normalize_before", [False, True])
def test_recorded_cross_attention_is_the_same_teacher_forced_and_step_by_step(
    normalize_before: bool,
) -> None:
    """The alignment layer's attention: rows of probabilities over the real source tokens only, the
    same whether the target is fed at once or one step at a time (beams reordered in between)."""
    cfg = small_config(decoder_normalize_before=normalize_before)
    model = seeded_model(cfg).eval()
    batch = make_batch([5, 2, 7], [6, 6, 6], seed=4)
    with torch.no_grad():
        plain = model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)
        with model.recording_cross_attention() as recorded:
            states = model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)
        torch.testing.assert_close(states, plain, rtol=0, atol=0)  # recording changes no output
        (full,) = recorded  # (B, T, S)
        assert full.shape == (3, 6, 7)
        torch.testing.assert_close(full.sum(-1), torch.ones(3, 6))
        assert torch.all(full[1, :, 2:] == 0) and torch.all(
            full[0, :, 5:] == 0
        )  # padding gets nothing
        state = model.init_decoder_state(model.encode(batch.src, batch.src_lengths))
        swap = torch.tensor([2, 0, 1])
        prev, expected = batch.prev, full
        with model.recording_cross_attention() as steps:
            for step in range(prev.shape[1]):
                model.decode_step(prev[:, step], state)
                torch.testing.assert_close(steps[-1][:, 0], expected[:, step], atol=1e-5, rtol=1e-5)
                state.reorder(swap)
                prev, expected = prev[swap], expected[swap]
        model.decode_step(prev[:, 0], state)
        assert len(steps) == prev.shape[1]  # the hook is gone after the block


def test_state_reorder_expands_beams() -> None:
    model = seeded_model(small_config()).eval()
    batch = make_batch([4, 3], [3, 3], seed=5)
    with torch.no_grad():
        expanded = model.init_decoder_state(
            model.encode(batch.src, batch.src_lengths).repeat_interleave(3)
        )
        reordered = model.init_decoder_state(model.encode(batch.src, batch.src_lengths))
        reordered.reorder(torch.tensor([0, 0, 0, 1, 1, 1]))
        tokens = torch.full((6,), BOS)
        torch.testing.assert_close(
            model.decode_step(tokens, reordered), model.decode_step(tokens, expanded)
        )


def test_empty_rows_give_no_nan_in_training() -> None:
    model = seeded_model(
        small_config(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1)
    ).train()
    batch = random_batch(5, seed=6, with_empty=True)
    for packed in (False, True):
        if packed:
            src, prev = batch.packed()
            hidden = model(src, batch.src_lengths, prev, batch.tgt_lengths, packed=True)
        else:
            hidden = model(batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)
        assert torch.isfinite(hidden).all()
        loss = model.output_projection(hidden).logsumexp(-1).sum()
        model.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_all_padding_batch_row_is_finite_in_eval() -> None:
    model = seeded_model(small_config()).eval()
    batch = make_batch([3, 1], [2, 1], seed=7)
    src = batch.src.clone()
    src[1] = PAD
    hidden = model(src, torch.tensor([3, 0]), batch.prev, torch.tensor([2, 0]))
    assert torch.isfinite(hidden).all()


def _num_params(cfg: ModelConfig) -> int:
    with torch.device("meta"):  # shapes only: big presets would take seconds and GBs to initialise
        model = build_model(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "vocab", "shared", "expected"),
    [
        # 3 x 198,272 (encoder layers) + 3 x 264,576 (decoder) + 8000 x 128 per embedding; without
        # --share-all-embeddings the preset still ties the decoder's input and output.
        ("transformer_tiny", 8000, False, 3_436_544),
        ("transformer_tiny", 8000, True, 2_412_544),
        ("transformer_base", 32000, True, 60_522_496),  # Vaswani et al.: 65M
        ("transformer_base_prenorm", 32000, True, 60_524_544),  # + 2 final layer norms
        ("transformer_big", 32000, True, 209_125_376),  # Vaswani et al.: 213M
        ("transformer_big_prenorm", 32000, True, 209_129_472),
    ],
)
def test_preset_parameter_counts(name: str, vocab: int, shared: bool, expected: int) -> None:
    cfg = model_config(
        name, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=PAD, share_all_embeddings=shared
    )
    assert _num_params(cfg) == expected


def test_presets_and_overrides() -> None:
    assert model_config("transformer_tiny") == ModelConfig()  # the defaults are the default preset
    cfg = model_config(
        "transformer_tiny",
        src_vocab_size=100,
        tgt_vocab_size=120,
        dropout=0.2,
        decoder_layers=4,
        share_all_embeddings=False,
    )
    assert (
        cfg.encoder_layers,
        cfg.decoder_layers,
        cfg.encoder_embed_dim,
        cfg.encoder_attention_heads,
    ) == (3, 4, 128, 4)
    assert (cfg.decoder_ffn_embed_dim, cfg.dropout, cfg.tgt_vocab_size) == (512, 0.2, 120)
    assert cfg.share_decoder_input_output_embed
    assert model_config("transformer_base_prenorm").decoder_normalize_before
    assert not model_config(
        "transformer_base_prenorm", decoder_normalize_before=False
    ).decoder_normalize_before
    with pytest.raises(ValueError, match="--encoder-dim"):
        model_config("transformer_tiny", encoder_dim=3)
    with pytest.raises(ValueError, match="--share-all-embeddings"):
        model_config("transformer_tiny", src_vocab_size=100, tgt_vocab_size=120)
    with pytest.raises(ValueError, match="--arch: must be one of"):
        model_config("transformer_huge")


def test_shared_embeddings_and_init() -> None:
    model = seeded_model(small_config(share_all_embeddings=True))
    weight = model.encoder.embed.tokens.weight
    assert model.decoder.embed.tokens.weight is weight and model.output_projection.weight is weight
    model = seeded_model(small_config(share_decoder_input_output_embed=True))
    assert model.output_projection.weight is model.decoder.embed.tokens.weight
    assert model.encoder.embed.tokens.weight is not model.decoder.embed.tokens.weight

    model = seeded_model(
        small_config(encoder_embed_dim=256, encoder_attention_heads=4, src_vocab_size=4000)
    )
    embedding = model.encoder.embed.tokens.weight
    assert embedding[PAD].abs().sum() == 0
    assert abs(embedding[1:].std().item() / 256**-0.5 - 1) < 0.05
    bound = (
        6 / (32 + 32)
    ) ** 0.5 * 2**-0.5  # xavier bound of one (D, D) chunk, fairseq's q/k/v gain
    qkv = model.decoder.layers[0].self_attn.qkv_proj.weight
    assert qkv.abs().max() <= bound and qkv.abs().max() > 0.9 * bound


def test_state_dict_rebuilds_from_config() -> None:
    cfg = small_config()
    model = seeded_model(cfg, seed=1).eval()
    assert not any(
        "positions" in key for key in model.state_dict()
    )  # sinusoids are rebuilt, not saved
    clone = build_model(cfg).eval()
    clone.load_state_dict(model.state_dict())
    batch = random_batch(3, seed=8)
    args = (batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths)
    torch.testing.assert_close(clone(*args), model(*args))


def test_model_package_imports_only_torch_and_config() -> None:
    code = (
        "import sys, nmt.model; "
        "bad = [m for m in sys.modules if m.startswith(('nmt.data', 'nmt.train', 'nmt.eval'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_padded_forward_compiles_without_graph_breaks() -> None:
    """Static-shape compilation (train/compile.py) needs one graph for the padded step."""
    import torch._dynamo

    model = seeded_model(small_config()).train()
    batch = random_batch(4, seed=9, with_empty=True)
    explanation = torch._dynamo.explain(model)(
        batch.src, batch.src_lengths, batch.prev, batch.tgt_lengths
    )
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), (
        explanation.break_reasons
    )


def test_cpu_dropout_rate_scale_gradient_and_seeding():
    from nmt.model.transformer import dropout

    x = torch.ones(400, 500, requires_grad=True)
    torch.manual_seed(7)
    y = dropout(x, 0.3, True)
    kept = y != 0
    assert abs(1.0 - kept.float().mean().item() - 0.3) < 0.005  # the drop rate
    assert y.sum().item() == pytest.approx(
        x.numel(), rel=0.01
    )  # inverted scaling keeps the expectation
    y.sum().backward()
    assert torch.equal(x.grad != 0, kept) and torch.allclose(x.grad[kept], y[kept])
    torch.manual_seed(7)
    assert torch.equal(dropout(x, 0.3, True), y)  # the global seed decides the mask
    assert dropout(x, 0.3, False) is x and dropout(x, 0.0, True) is x


def test_shape_names_overridden_dimensions() -> None:
    """The training log names the arch; its shape shows what --*-embed-dim overrides changed."""
    assert model_config("transformer_tiny").shape() == "3+3 layers x 128 (FFN 512)"
    wider = model_config(
        "transformer_tiny", encoder_embed_dim=192, decoder_embed_dim=192, decoder_ffn_embed_dim=768
    )
    assert wider.shape() == "encoder 3 layers x 192 (FFN 512), decoder 3 layers x 192 (FFN 768)"

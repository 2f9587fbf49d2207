"""nmt-export to CTranslate2: the weights map exactly, the search gives our outputs, errors are one line."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import atomic_torch_save, load_checkpoint
from nmt.config import ModelConfig
from nmt.data.spm import BOS_ID, EOS_ID, SentencePieceModel
from nmt.deploy.ct2 import build_spec, export_ctranslate2
from nmt.eval import Translator
from nmt.eval.ct2_model import CT2Model, pieces
from nmt.model import build_model
from nmt_cli.eval import main as eval_main
from nmt_cli.export import main as export_main

from ..helpers import tiny_model_config

# an extra ([ct2]): CI installs it, a bare GPU machine running `pytest -m cuda` may not
ctranslate2 = pytest.importorskip("ctranslate2")


def test_float32_export_gives_our_translations_and_scores(tiny, exported) -> None:
    ours = Translator.from_checkpoint(tiny.checkpoint)
    theirs = Translator.from_checkpoint(exported)
    assert isinstance(theirs.model, CT2Model)
    for beam in (1, 5):
        expected = ours.translate_nbest(tiny.test_src, beam=beam)
        got = theirs.translate_nbest(tiny.test_src, beam=beam)
        assert [n[0].tokens for n in got] == [n[0].tokens for n in expected]
        assert [n[0].text for n in got] == [n[0].text for n in expected]
        # Same normalisation as ours: sum of log-probs with EOS, divided by (tokens + 1) ** lenpen.
        # CTranslate2's search scores its hypotheses up to ~3e-3 away from its own forced decoding
        # of them (measured: 'sits sits cat man', -0.04898 in translate_batch, -0.05161 in
        # score_batch, ours -0.05161), so the search's scores are compared loosely here and the
        # export's exactness is checked on forced decoding below.
        np.testing.assert_allclose(
            [n[0].score for n in got], [n[0].score for n in expected], atol=5e-3
        )
    hypotheses = [n[0].tokens for n in ours.translate_nbest(tiny.test_src, beam=5)]
    sources = ours.encode(tiny.test_src)
    ours_forced = ours.score_targets(sources, [[*h, EOS_ID] for h in hypotheses])
    tgt_pieces = pieces(theirs.tgt_spm)
    theirs_forced = theirs.model.translator.score_batch(
        [[theirs.model._src_pieces[i] for i in source[:-1]] for source in sources],  # EOS: theirs
        [[tgt_pieces[i] for i in h] for h in hypotheses],
    )
    for mine, their in zip(ours_forced, theirs_forced, strict=True):
        np.testing.assert_allclose(their.log_probs, mine.token_scores, atol=1e-4)
    lenpen = dict(beam=4, lenpen=0.3, nbest=2)
    assert theirs.translate(tiny.test_src, **lenpen) == ours.translate(tiny.test_src, **lenpen)
    assert [len(n) for n in theirs.translate_nbest(tiny.test_src, **lenpen)] == [2] * len(
        tiny.test_src
    )


def test_length_limits_and_empty_lines_as_ours(tiny, exported) -> None:
    ours = Translator.from_checkpoint(tiny.checkpoint)
    theirs = Translator.from_checkpoint(exported)
    lines = ["", *tiny.test_src[:8], "   "]
    assert theirs.translate(lines) == ours.translate(lines)
    assert theirs.translate(lines)[0] == "" and theirs.translate([]) == []
    # A limit shorter than the outputs: every sentence is cut at its own limit (a batch holds several
    # limits); greedy cuts give exactly our tokens, beams respect the limit.
    tight = dict(max_len_a=0.3, max_len_b=1)
    greedy_ours = ours.translate_nbest(tiny.test_src, beam=1, **tight)
    greedy_theirs = theirs.translate_nbest(tiny.test_src, beam=1, **tight)
    assert [n[0].tokens for n in greedy_theirs] == [n[0].tokens for n in greedy_ours]
    sources = [np.array(ids + [EOS_ID]) for ids in theirs.src_spm.encode(tiny.test_src)]
    for source, nbest in zip(sources, theirs.generate(sources, beam=5, nbest=5, **tight)):
        assert all(len(h.tokens) <= int(0.3 * len(source) + 1) for h in nbest)
    assert any(
        len(n[0].tokens) < len(m[0].tokens)
        for n, m in zip(greedy_theirs, ours.translate_nbest(tiny.test_src, beam=1))
    )


def test_sampling_draws_ranked_samples(tiny, exported) -> None:
    theirs = Translator.from_checkpoint(exported)
    samples = theirs.translate_nbest(
        tiny.test_src, sampling=True, beam=4, nbest=4, temperature=3.0, seed=7
    )
    assert all(
        len(n) == 4 and [t.score for t in n] == sorted((t.score for t in n), reverse=True)
        for n in samples
    )
    assert any(
        len({t.text for t in n}) > 1 for n in samples
    )  # samples, not four copies of the best


def _config_variants() -> dict[str, dict]:
    return {
        "prenorm_gelu_learned_separate": dict(
            encoder_normalize_before=True,
            decoder_normalize_before=True,
            activation_fn="gelu",
            encoder_learned_pos=True,
            decoder_learned_pos=True,
            no_scale_embedding=True,
        ),
        "mixed_norms_heads_dims_shared_output": dict(
            encoder_normalize_before=False,
            decoder_normalize_before=True,
            encoder_attention_heads=2,
            decoder_embed_dim=48,
            decoder_attention_heads=3,
            decoder_ffn_embed_dim=96,
            share_decoder_input_output_embed=True,
        ),
        "postnorm_shared_all": dict(share_all_embeddings=True),
    }


@pytest.mark.parametrize("variant", sorted(_config_variants()))
def test_every_weight_maps_exactly(tiny, tmp_path, variant) -> None:
    """Teacher-forced log-probabilities of CTranslate2 (score_batch) equal ours on random models."""
    state = load_checkpoint(tiny.checkpoint)
    vocab_size = state["model_config"]["src_vocab_size"]
    cfg = tiny_model_config(  # shares no embedding unless the variant says so
        vocab_size,
        dim=64,
        decoder_layers=3,
        max_source_positions=40,
        max_target_positions=48,
        **_config_variants()[variant],
    )
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # random biases and norms, so a bias or norm mapped wrong shows
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
    checkpoint = str(tmp_path / "random.pt")
    atomic_torch_save(
        {**state, "model": model.state_dict(), "model_config": dataclasses.asdict(cfg)}, checkpoint
    )
    export_ctranslate2([checkpoint], str(tmp_path / "ct2"))

    spm = SentencePieceModel(bytes(state["vocab"]["src_spm"].numpy()))
    sources = spm.encode(tiny.test_src[:6])
    targets = spm.encode(tiny.test_tgt[:6])
    vocab = pieces(spm)
    scored = ctranslate2.Translator(str(tmp_path / "ct2")).score_batch(
        [[vocab[i] for i in s] for s in sources], [[vocab[i] for i in t] for t in targets]
    )
    for source, target, result in zip(sources, targets, scored):
        src = torch.tensor([source + [EOS_ID]])
        prev = torch.tensor([[BOS_ID] + target])
        with torch.no_grad():
            hidden = model(src, torch.tensor([src.shape[1]]), prev, torch.tensor([prev.shape[1]]))
            log_probs = F.log_softmax(model.output_projection(hidden)[0], dim=-1)
        expected = log_probs.gather(1, torch.tensor(target + [EOS_ID])[:, None])[:, 0]
        assert result.tokens == [vocab[i] for i in target] + [vocab[EOS_ID]]
        np.testing.assert_allclose(result.log_probs, expected.numpy(), atol=2e-4)


def test_int8_export_is_smaller_and_translates_alike(tiny, exported, tmp_path) -> None:
    int8 = str(tmp_path / "int8")
    export_ctranslate2([tiny.checkpoint], int8, quantization="int8")
    assert os.path.getsize(os.path.join(int8, "model.bin")) < 0.5 * os.path.getsize(
        os.path.join(exported, "model.bin")
    )
    with open(os.path.join(int8, "nmt_export.json"), encoding="utf-8") as handle:
        assert json.load(handle)["quantization"] == "int8"
    ours = Translator.from_checkpoint(tiny.checkpoint).translate(tiny.test_src)
    quantized = Translator.from_checkpoint(int8).translate(tiny.test_src)
    # int8 rounding flips a few of the tiny model's near-tied choices (23 of 30 agree); a broken
    # quantization agrees on none.
    assert sum(a == b for a, b in zip(quantized, ours)) >= 0.7 * len(ours)


def test_cli_export_then_nmt_eval_on_the_directory(tiny, tmp_path, capsys) -> None:
    output_dir = str(tmp_path / "ct2")
    assert export_main([tiny.checkpoint, "--output-dir", output_dir]) == 0
    assert "wrote" in capsys.readouterr().out
    assert sorted(os.listdir(output_dir)) == [
        ".nmt-made-by",  # what --force may replace
        "config.json",
        "model.bin",
        "nmt_export.json",
        "shared_vocabulary.json",
        "spm.model",
    ]
    hypotheses = {}
    for name, path in (("ours", tiny.checkpoint), ("ct2", output_dir)):
        hypotheses[name] = str(tmp_path / f"{name}.de")
        assert (
            eval_main(
                [tiny.data_dir, "--path", path, "--split", "test", "--output", hypotheses[name]]
            )
            == 0
        )
        assert "BLEU = " in capsys.readouterr().out
    with (
        open(hypotheses["ours"], encoding="utf-8") as a,
        open(hypotheses["ct2"], encoding="utf-8") as b,
    ):
        assert a.read() == b.read()
    # An existing directory is kept unless --force; with --force it is replaced whole.
    assert export_main([tiny.checkpoint, "--output-dir", output_dir, "--quantization", "int8"]) == 1
    assert "pass --force" in capsys.readouterr().err
    assert (
        export_main(
            [tiny.checkpoint, "--output-dir", output_dir, "--quantization", "int8", "--force"]
        )
        == 0
    )
    with open(os.path.join(output_dir, "nmt_export.json"), encoding="utf-8") as handle:
        assert json.load(handle)["quantization"] == "int8"
    assert not [
        name for name in os.listdir(tmp_path) if name.startswith(".ct2")
    ]  # no temporary left


def test_half_precision_flags_are_ignored_on_an_export_with_a_warning(
    tiny, exported, caplog
) -> None:
    theirs = Translator.from_checkpoint(exported, dtype="float16")
    assert theirs.translate(tiny.test_src[:3]) == Translator.from_checkpoint(exported).translate(
        tiny.test_src[:3]
    )
    assert any(
        "runs the type it was exported with; float16 ignored" in r.getMessage()
        for r in caplog.records
    )


def test_nmt_eval_refuses_forced_decoding_on_an_export_before_reading_input(
    exported, tmp_path, capsys
) -> None:
    broken = tmp_path / "broken.en"
    broken.write_bytes(b"\xff not UTF-8\n")  # read first, this would be the error
    assert eval_main(["--path", exported, "--input", str(broken), "--format", "fairseq"]) == 1
    assert (
        "needs the PyTorch checkpoint; an exported directory only translates"
        in capsys.readouterr().err
    )


def test_ctranslate2_runs_one_thread_per_core_unless_told(exported, monkeypatch) -> None:
    """CTranslate2's own default is 4 threads whatever the machine (oversubscribed on 2 cores)."""
    threads = []
    real = ctranslate2.Translator
    monkeypatch.setattr(
        ctranslate2,
        "Translator",
        lambda *args, **kwargs: threads.append(kwargs["intra_threads"]) or real(*args, **kwargs),
    )
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    CT2Model.load(exported)
    CT2Model.load(exported, threads=3)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    CT2Model.load(exported)  # 0: CTranslate2 then reads OMP_NUM_THREADS
    assert threads == [len(os.sched_getaffinity(0)), 3, 0]


def test_an_exported_model_translates_without_importing_torch(tiny, exported) -> None:
    """Deployment start-up: torch's import is most of a short nmt-eval's time, and an export does
    without it (nmt-eval on a split, scored, and the Python API)."""
    program = (
        "import sys\n"
        "from nmt_cli.eval import main\n"
        f"assert main([{tiny.data_dir!r}, '--path', {exported!r}, '--split', 'test', '--quiet']) == 0\n"
        "import nmt\n"
        f"print(repr(nmt.Translator.from_checkpoint({exported!r}).translate('a b c')))\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert "BLEU = " in run.stdout and run.stdout.strip().endswith("torch imported: False"), (
        run.stdout
    )
    assert "decoding on cpu with CTranslate2 (float32)" in run.stderr


def _one_line_error(argv: list[str], capsys) -> str:
    assert export_main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("nmt-export: error:") and len(err.splitlines()) == 1, err
    return err


def test_what_cannot_be_exported_is_a_one_line_error(tiny, tmp_path, capsys, monkeypatch) -> None:
    state = load_checkpoint(tiny.checkpoint)
    output_dir = str(tmp_path / "out")

    newer = {**state, "model_config": {**state["model_config"], "rotary_positions": True}}
    atomic_torch_save(newer, str(tmp_path / "newer.pt"))
    assert "--rotary-positions is not supported" in _one_line_error(
        [str(tmp_path / "newer.pt"), "--output-dir", output_dir], capsys
    )

    extra = {
        **state,
        "model": {**state["model"], "encoder.layernorm_embedding.weight": torch.ones(4)},
    }
    atomic_torch_save(extra, str(tmp_path / "extra.pt"))
    assert "weights do not match" in _one_line_error(
        [str(tmp_path / "extra.pt"), "--output-dir", output_dir], capsys
    )

    resized = {
        **state,
        "model_config": {**state["model_config"], "src_vocab_size": 80, "tgt_vocab_size": 80},
    }
    resized["model"] = build_model(
        ModelConfig(**{**state["model_config"], "src_vocab_size": 80, "tgt_vocab_size": 80})
    ).state_dict()
    atomic_torch_save(resized, str(tmp_path / "resized.pt"))
    assert "differs from its SentencePiece model" in _one_line_error(
        [str(tmp_path / "resized.pt"), "--output-dir", output_dir], capsys
    )

    (tmp_path / "garbage.pt").write_bytes(b"garbage")
    assert "not an nmt checkpoint" in _one_line_error(
        [str(tmp_path / "garbage.pt"), "--output-dir", output_dir], capsys
    )
    assert not os.path.exists(output_dir)  # nothing half-written

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if not installed
    assert "pip install 'nmt[ct2]'" in _one_line_error(
        [tiny.checkpoint, "--output-dir", output_dir], capsys
    )


def test_a_parameter_the_exporter_does_not_know_is_refused(tiny) -> None:
    """A model grown a new weight (and an exporter not taught about it) must not export without it."""
    state = load_checkpoint(tiny.checkpoint)
    model = build_model(ModelConfig(**state["model_config"]))
    model.decoder.register_parameter("output_bias", torch.nn.Parameter(torch.zeros(4)))
    spm = SentencePieceModel(bytes(state["vocab"]["src_spm"].numpy()))
    with pytest.raises(
        ValueError, match="parameter decoder.output_bias has no CTranslate2 counterpart"
    ):
        build_spec(model, src_spm=spm, tgt_spm=spm, name="grown.pt")


def test_directory_errors_name_the_directory(tiny, exported, tmp_path, monkeypatch) -> None:
    theirs = Translator.from_checkpoint(exported)
    sources = theirs.encode(tiny.test_src[:2])
    with pytest.raises(ValueError, match="needs the PyTorch checkpoint"):
        theirs.score_targets(sources, [list(source[:-1]) for source in sources])
    with pytest.raises(ValueError, match="not one written by nmt-export"):
        Translator.from_checkpoint(str(tmp_path))
    with pytest.raises(ValueError, match="--device mps: CTranslate2 runs on cpu or cuda"):
        Translator.from_checkpoint(exported, device="mps")
    if ctranslate2.get_cuda_device_count() == 0:
        with pytest.raises(
            ValueError,
            match=r"--device cuda:0: no CUDA device is available \(use --device auto or cpu\)",
        ):
            Translator.from_checkpoint(exported, device="cuda:0")
    with pytest.raises(ValueError, match="an exported directory decodes alone"):
        Translator.from_checkpoint([tiny.checkpoint, exported])
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with pytest.raises(
        ValueError, match=r"needs the ctranslate2 package: pip install 'nmt\[ct2\]'"
    ):
        Translator.from_checkpoint(exported)

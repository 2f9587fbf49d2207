"""A fairseq-train command line runs under nmt-train with the data argument changed, and its flags
mean what they mean in fairseq."""

import json

import pytest
import torch

from nmt.checkpoint_io import load_checkpoint

from ..helpers import REVERSAL_PAIRS, TINY_MODEL_FLAGS, run_subprocess, tiny_corpus, tiny_dataset
from .test_trainer import make_trainer

# fairseq's IWSLT'14 de-en recipe (examples/translation/README.md), as a user pastes it.
FAIRSEQ_TRAIN = [
    "--task",
    "translation",
    "-s",
    "en",
    "-t",
    "de",
    "--arch",
    "transformer_iwslt_de_en",
    "--share-decoder-input-output-embed",
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9, 0.98)",
    "--clip-norm",
    "0.0",
    "--lr",
    "5e-4",
    "--lr-scheduler",
    "inverse_sqrt",
    "--warmup-updates",
    "4000",
    "--dropout",
    "0.3",
    "--weight-decay",
    "0.0001",
    "--criterion",
    "label_smoothed_cross_entropy",
    "--label-smoothing",
    "0.1",
    "--max-tokens",
    "4096",
    "--save-interval",
    "1",
    "--keep-last-epochs",
    "5",
    "--eval-bleu",
    "--eval-bleu-args",
    '{"beam": 5, "max_len_a": 1.2, "max_len_b": 10}',
    "--eval-bleu-detok",
    "moses",
    "--eval-bleu-remove-bpe",
    "--eval-bleu-print-samples",
    "--best-checkpoint-metric",
    "bleu",
    "--maximize-best-checkpoint-metric",
    "--no-progress-bar",
    "--cpu",
]


@pytest.fixture(scope="module")
def fairseq_data(tmp_path_factory):
    """The smallest data the IWSLT command line proves its point on: its 6+6-layer, 512-wide model
    costs seconds per thousand tokens on 2 cores (tiny_data's 600 pairs took 30 s), and BLEU
    validation decodes every validation pair to 1.2x its length + 10 with beam 5."""
    root = tmp_path_factory.mktemp("fairseq")
    tiny_corpus(root, {"train": (60, 30), "valid": (4, 31)}, **REVERSAL_PAIRS)
    return tiny_dataset(root)


@pytest.mark.slow
def test_fairseq_iwslt_command_line_runs_with_only_the_data_changed(fairseq_data, tmp_path):
    log_file = tmp_path / "train.log"
    extra = [
        "--save-dir",
        str(tmp_path / "ck"),
        "--max-update",
        "2",
        "--log-file",
        str(log_file),
        "--log-format",
        "json",
    ]
    result = run_subprocess([fairseq_data, *FAIRSEQ_TRAIN, *extra])
    assert result.returncode == 0, result.stderr[-3000:]
    best = load_checkpoint(str(tmp_path / "ck" / "checkpoint_best.pt"))
    train_config = best["train_config"]
    assert (
        tuple(train_config["optim"]["adam_betas"]) == (0.9, 0.98)
        and train_config["optim"]["weight_decay"] == 0.0001
    )
    assert (
        best["model_config"]["encoder_layers"] == 6
        and best["model_config"]["encoder_ffn_embed_dim"] == 1024
    )
    assert (
        best["model_config"]["share_decoder_input_output_embed"]
        and best["model_config"]["dropout"] == 0.3
    )
    valid = [
        json.loads(line)
        for line in log_file.read_text().splitlines()
        if line.startswith('{"kind": "valid"')
    ]
    assert valid and best["best"] == max(r["valid_bleu"] for r in valid)  # bleu maximized
    assert "example hypothesis:" in log_file.read_text()


def test_fairseq_values_we_do_not_have_are_one_line_errors(tiny_data, tmp_path, capsys):
    from nmt.data import load_manifest
    from nmt_cli.train import build_parser, make_configs

    for flag, value in (
        ("--criterion", "cross_entropy"),
        ("--task", "language_modeling"),
        ("--optimizer", "sgd"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args([tiny_data, flag, value])
        assert (
            exit_info.value.code == 2
            and f"argument {flag}: invalid choice: '{value}'" in capsys.readouterr().err
        )
    manifest = load_manifest(tiny_data)
    for extra, message in (
        (["--eval-bleu-args", '{"beem": 5}'], "--eval-bleu-args: unknown search options ['beem']"),
        (["--arch", "lstm"], "--arch: must be one of"),
    ):
        with pytest.raises(
            ValueError, match=message.replace("[", r"\[").replace("]", r"\]")
        ) as error:
            make_configs(build_parser().parse_args([tiny_data, *extra]), manifest)
        assert "\n" not in str(error.value)


def test_weight_decay_is_decoupled_as_in_fairseq(tiny_data, tmp_path):
    trainer = make_trainer(
        tiny_data, tmp_path / "ck", "--weight-decay", "0.1", "--lr", "0.01", "--warmup-updates", "0"
    )
    optimizer = trainer.step.optimizer
    trainer.step.scheduler.step(1.0)  # the lr of update 1
    parameter = next(trainer.model.parameters())
    before = parameter.detach().clone()
    parameter.grad = torch.zeros_like(parameter)  # no gradient: only the decay moves the weight
    optimizer.step()
    # Decoupled: p <- p (1 - lr wd); L2 through Adam would move every weight by about lr instead.
    torch.testing.assert_close(parameter.detach(), before * (1 - 0.01 * 0.1))
    trainer.close()


def test_tiny_flags_still_override_a_fairseq_arch(tiny_data, tmp_path):
    trainer = make_trainer(
        tiny_data, tmp_path / "ck", "--arch", "transformer_wmt_en_de_big", *TINY_MODEL_FLAGS
    )
    assert trainer.model_cfg.encoder_layers == 1 and trainer.model_cfg.attention_dropout == 0.1
    trainer.close()
    make_trainer(tiny_data, tmp_path / "ck").close()  # the lock went with the first trainer

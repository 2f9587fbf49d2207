"""nmt-eval as a fairseq-generate user drives it: ensembles, --format fairseq, --score-reference,
fairseq's flag spellings, streaming stdin, and references that do not match the source."""

from __future__ import annotations

import functools
import logging
import math
import os
import subprocess
import sys
import threading

import pytest
import sentencepiece
import torch
import torch.nn.functional as F

from nmt.checkpoint_io import atomic_torch_save, load_checkpoint
from nmt.command import config_from_args
from nmt.config import EvalConfig, EvalIOConfig
from nmt.data.spm import BOS_ID, EOS_ID
from nmt.eval import Translator
from nmt_cli.eval import build_parser, main

from ..helpers import run_cli

run = functools.partial(run_cli, main)


def read(path) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def spm(tiny) -> sentencepiece.SentencePieceProcessor:
    return sentencepiece.SentencePieceProcessor(model_file=os.path.join(tiny.data_dir, "spm.model"))


def test_fairseq_format_prints_every_nbest_with_scores_and_alignments(
    tiny, tmp_path, capsys
) -> None:
    output = tmp_path / "gen.txt"
    lenpen = 0.5
    code, out, err = run(
        [
            tiny.data_dir,
            "--path",
            tiny.checkpoint,
            "--format",
            "fairseq",
            "--beam",
            "3",
            "--nbest",
            "2",
            "--lenpen",
            str(lenpen),
            "--print-alignment",
            "--output",
            str(output),
        ],
        capsys=capsys,
    )
    assert code == 0, err
    lines = read(output)
    expected = Translator.from_checkpoint(tiny.checkpoint).translate_nbest(
        tiny.test_src, beam=3, nbest=2, lenpen=lenpen
    )
    pieces = spm(tiny)
    per_sentence = 2 + 2 * 4  # S, T, then H, D, P, A per hypothesis
    for index, (source, reference, nbest) in enumerate(zip(tiny.test_src, tiny.test_tgt, expected)):
        block = lines[index * per_sentence : (index + 1) * per_sentence]
        assert block[0] == f"S-{index}\t" + " ".join(pieces.encode(source, out_type=str))
        assert block[1] == f"T-{index}\t" + " ".join(pieces.encode(reference, out_type=str))
        for rank, translation in enumerate(nbest):
            h, d, p, a = (line.split("\t") for line in block[2 + 4 * rank : 6 + 4 * rank])
            assert (h[0], d[0], p[0], a[0]) == (
                f"H-{index}",
                f"D-{index}",
                f"P-{index}",
                f"A-{index}",
            )
            score = float(h[1])
            assert (
                score == float(d[1]) == pytest.approx(translation.score / math.log(2), abs=1e-5)
            )  # base 2
            assert (
                h[2].split(" ") == [pieces.id_to_piece(t) for t in translation.tokens]
                and d[2] == translation.text
            )
            positional = [float(x) for x in p[1].split(" ")]
            assert len(positional) == len(translation.tokens) + 1
            assert sum(positional) / len(positional) ** lenpen == pytest.approx(
                score, abs=2e-3
            )  # 4 decimals each
            assert [int(pair.split("-")[1]) for pair in a[1].split(" ")] == list(
                range(len(translation.tokens))
            )
    assert lines[len(expected) * per_sentence].startswith("Generate test with beam=3: BLEU = ")
    assert "BLEU = " in out  # a file output: the scores are on stdout too


def test_score_reference_gives_the_forced_decoding_score_of_each_reference(
    tiny, tmp_path, capsys
) -> None:
    output = tmp_path / "scores.txt"
    code, out, err = run(
        [tiny.data_dir, "--path", tiny.checkpoint, "--score-reference", "--output", str(output)],
        capsys=capsys,
    )
    assert code == 0, err
    printed = [float(line) for line in read(output)]
    assert len(printed) == len(tiny.test_tgt)
    model, pieces = load_model(tiny), spm(tiny)
    for source, reference, value in zip(tiny.test_src, tiny.test_tgt, printed):
        src = torch.tensor([pieces.encode(source) + [EOS_ID]])
        target = torch.tensor([pieces.encode(reference) + [EOS_ID]])
        prev = torch.cat([torch.tensor([[BOS_ID]]), target[:, :-1]], dim=1)
        with torch.no_grad():
            lprobs = F.log_softmax(
                model.output_projection(model(src, torch.tensor([src.shape[1]]), prev, None)),
                dim=-1,
            )
        expected = float(lprobs.gather(2, target[..., None]).sum()) / target.shape[1] / math.log(2)
        assert value == pytest.approx(expected, abs=2e-4)
    assert "reference log-probability per token" in out and "perplexity" in out
    assert "BLEU" not in out  # nothing was translated


def load_model(tiny):
    return Translator.from_checkpoint(tiny.checkpoint).model


def test_score_reference_in_fairseq_format_prints_the_reference_as_hypothesis(tiny, capsys) -> None:
    code, out, err = run(
        [tiny.data_dir, "--path", tiny.checkpoint, "--score-reference", "--format", "fairseq"],
        capsys=capsys,
    )
    assert code == 0, err
    pieces = spm(tiny)
    h_lines = [line.split("\t") for line in out.split("\n") if line.startswith("H-")]
    assert [h[2] for h in h_lines] == [
        " ".join(pieces.encode(ref, out_type=str)) for ref in tiny.test_tgt
    ]
    d_lines = [line.split("\t") for line in out.split("\n") if line.startswith("D-")]
    assert [d[2] for d in d_lines] == tiny.test_tgt


def test_ensemble_and_average_through_the_cli(tiny, tmp_path, capsys) -> None:
    state = load_checkpoint(tiny.checkpoint)
    generator = torch.Generator().manual_seed(3)
    state["model"] = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
        for k, v in state["model"].items()
    }
    other = str(tmp_path / "other.pt")
    atomic_torch_save(state, other)
    source = tmp_path / "in.en"
    source.write_text("\n".join(tiny.test_src[:5]) + "\n", encoding="utf-8")
    for extra, translator in (
        ([], Translator.from_checkpoint([tiny.checkpoint, other])),
        (["--average"], Translator.from_checkpoint([tiny.checkpoint, other], average=True)),
    ):
        code, out, err = run(
            ["--path", f"{tiny.checkpoint}:{other}", *extra, "--input", str(source), "--beam", "2"],
            capsys=capsys,
        )
        assert code == 0, err
        assert out.split("\n")[:-1] == translator.translate(tiny.test_src[:5], beam=2)
    code, _, err = run(
        ["--path", f"{tiny.checkpoint},{other}", "--input", str(source)], capsys=capsys
    )
    assert (
        code == 1
        and "a comma does not separate checkpoints" in err
        and f"{tiny.checkpoint}:{other} ensembles" in err
    )
    state["vocab"] = {**state["vocab"], "source_lang": "fr"}
    atomic_torch_save(state, other)
    code, _, err = run(
        ["--path", f"{tiny.checkpoint}:{other}", "--input", str(source)], capsys=capsys
    )
    assert (
        code == 1
        and err.strip().splitlines()[-1].startswith("nmt-eval: error: ")
        and "vocabulary differs" in err
    )


def test_fairseq_spellings_parse_to_our_options() -> None:
    args = build_parser().parse_args(
        [
            "DATA",
            "--path",
            "a.pt:b.pt",
            "--gen-subset",
            "valid",
            "--sampling",
            "--sampling-topk",
            "5",
            "--sampling-topp",
            "0.9",
            "--max-sentences",
            "7",
            "--cpu",
            "--quiet",
            "--format",
            "fairseq",
            "--results-path",
            "out",
        ]
    )
    io, cfg = config_from_args(EvalIOConfig, args), config_from_args(EvalConfig, args)
    assert (io.split, io.device, io.quiet, io.checkpoint_paths) == (
        "valid",
        "cpu",
        True,
        ["a.pt", "b.pt"],
    )
    assert io.output_path == os.path.join("out", "generate-valid.txt")
    assert (cfg.topk, cfg.topp, cfg.batch_size) == (5, 0.9, 7)
    assert build_parser().parse_args(["--path", "x", "--batch-size", "3"]).batch_size == 3
    assert build_parser().parse_args(["--path", "x"]).device == "auto"


def test_results_path_quiet_cpu_gen_subset(tiny, tmp_path, capsys) -> None:
    results = tmp_path / "results"
    code, out, err = run(
        [
            tiny.data_dir,
            "--path",
            tiny.checkpoint,
            "--gen-subset",
            "test",
            "--results-path",
            str(results),
            "--cpu",
            "--quiet",
            "--format",
            "fairseq",
            "--batch-size",
            "4",
        ],
        capsys=capsys,
    )
    assert code == 0, err
    written = read(results / "generate-test.txt")
    assert written[0].startswith("Generate test with beam=5: BLEU = ") and not any(
        line[:2] in ("S-", "H-") for line in written
    )
    assert "BLEU = " in out


def test_fp16_on_the_cpu_warns_once_and_decodes_in_float32(tiny, capsys, caplog) -> None:
    source = os.path.join(os.path.dirname(tiny.data_dir), "test.en")
    with caplog.at_level(logging.INFO):
        code, out, err = run(
            ["--path", tiny.checkpoint, "--input", source, "--fp16"], capsys=capsys
        )
    assert code == 0, err
    if torch.cuda.is_available():
        pytest.skip("CUDA here: --fp16 decodes in float16 (checked by test_fp16_on_cuda)")
    warnings = [r for r in caplog.records if "--fp16 ignored on the CPU" in r.getMessage()]
    assert len(warnings) == 1 and any("decoding on cpu" in r.getMessage() for r in caplog.records)
    assert out.split("\n")[:-1] == Translator.from_checkpoint(tiny.checkpoint).translate(
        tiny.test_src
    )


@pytest.mark.cuda
def test_fp16_on_cuda(tiny, capsys) -> None:
    source = os.path.join(os.path.dirname(tiny.data_dir), "test.en")
    code, out, err = run(
        ["--path", tiny.checkpoint, "--input", source, "--fp16", "--format", "fairseq"],
        capsys=capsys,
    )
    assert code == 0, err
    hypotheses = [line.split("\t")[2] for line in out.split("\n") if line.startswith("D-")]
    expected = Translator.from_checkpoint(tiny.checkpoint).translate(tiny.test_src)
    assert sum(h == e for h, e in zip(hypotheses, expected)) >= 0.9 * len(expected)


@pytest.mark.parametrize("delta", [1, -1])
def test_reference_with_another_line_count_is_one_line_error(tiny, tmp_path, capsys, delta) -> None:
    references = tiny.test_tgt + ["extra"] if delta > 0 else tiny.test_tgt[:-1]
    reference = tmp_path / "ref.de"
    reference.write_text("\n".join(references) + "\n", encoding="utf-8")
    code, out, err = run(
        [tiny.data_dir, "--path", tiny.checkpoint, "--reference", str(reference)], capsys=capsys
    )
    assert code == 1 and out == ""
    message = err.strip().splitlines()[-1]
    assert message == (
        f"nmt-eval: error: {reference}: the reference has {len(references)} lines but the source has {len(tiny.test_tgt)}; "
        "they must align line for line"
    )
    source = os.path.join(os.path.dirname(tiny.data_dir), "test.en")
    code, out, err = run(
        ["--path", tiny.checkpoint, "--input", source, "--reference", str(reference)], capsys=capsys
    )
    assert (
        code == 1
        and out == ""
        and f"has {len(references)} lines but the source has {len(tiny.test_tgt)}" in err
    )


def test_stdin_with_a_shorter_reference_fails_without_a_score(
    tiny, tmp_path, capsys, monkeypatch
) -> None:
    import io as io_module

    reference = tmp_path / "ref.de"
    reference.write_text("\n".join(tiny.test_tgt[:2]) + "\n", encoding="utf-8")
    monkeypatch.setattr(
        sys,
        "stdin",
        io_module.TextIOWrapper(io_module.BytesIO(("\n".join(tiny.test_src[:3]) + "\n").encode())),
    )
    code, out, err = run(
        ["--path", tiny.checkpoint, "--reference", str(reference), "--buffer-size", "1"],
        capsys=capsys,
    )
    assert (
        code == 1
        and "the reference has 2 lines but <stdin> has more" in err
        and "BLEU" not in out + err
    )


@pytest.mark.parametrize("stdin", ["pipe, --buffer-size 1", "terminal"])
def test_each_line_is_translated_before_the_next_is_read(tiny, stdin) -> None:
    """The first translation comes back while stdin is still open: on a pipe with --buffer-size 1,
    and by default when stdin is a terminal (a pseudo-terminal here)."""
    lines = ["dog", "the red ball"]
    expected = Translator.from_checkpoint(tiny.checkpoint).translate(lines)
    command = [sys.executable, "-m", "nmt_cli.eval", "--path", tiny.checkpoint]
    if stdin == "terminal":
        terminal, process_stdin = os.openpty()
        write = lambda text: os.write(terminal, text.encode())  # noqa: E731
        end_of_input = lambda: os.write(terminal, b"\x04")  # noqa: E731  (Ctrl-D at a line start)
    else:
        command += ["--buffer-size", "1"]
        process_stdin = subprocess.PIPE
    process = subprocess.Popen(
        command,
        stdin=process_stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if stdin != "terminal":
        write = lambda text: (process.stdin.write(text), process.stdin.flush())  # noqa: E731
        end_of_input = process.stdin.close
    watchdog = threading.Timer(
        120, process.kill
    )  # a CLI that waits for more input fails, never hangs
    watchdog.start()
    try:
        translations = []
        for line in lines:
            write(line + "\n")
            translations.append(process.stdout.readline())
        end_of_input()
        assert process.wait() == 0
    finally:
        watchdog.cancel()
        process.kill()
        if stdin == "terminal":
            os.close(terminal)
            os.close(process_stdin)
    assert translations == [text + "\n" for text in expected]


def test_post_process_sentencepiece_shows_text_in_every_line(tiny, capsys) -> None:
    code, out, err = run(
        [
            tiny.data_dir,
            "--path",
            tiny.checkpoint,
            "--format",
            "fairseq",
            "--remove-bpe",
            "sentencepiece",
        ],
        capsys=capsys,
    )
    assert code == 0, err
    tagged = {
        tag: [line.split("\t")[-1] for line in out.split("\n") if line.startswith(tag + "-")]
        for tag in "STHD"
    }
    assert tagged["S"] == tiny.test_src and tagged["T"] == tiny.test_tgt
    assert (
        tagged["H"]
        == tagged["D"]
        == Translator.from_checkpoint(tiny.checkpoint).translate(tiny.test_src)
    )

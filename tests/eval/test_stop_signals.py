"""SIGTERM to nmt-eval in the middle of a translation: it ends within seconds, its output is the
old file or none (never half of the new one), and no temporary is left beside it."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from ..helpers import TINY_MODEL_PAIRS, process_group, tiny_corpus, tiny_dataset

STOP_SECONDS = 10


@pytest.mark.slow
def test_sigterm_mid_translation_leaves_the_old_output_and_no_temporary(tiny, tmp_path):
    words = [word for line in tiny.test_src for word in line.split()]
    rng = random.Random(0)
    source = tmp_path / "source.en"
    source.write_text(
        "".join(" ".join(rng.choices(words, k=12)) + "\n" for _ in range(20000)), encoding="utf-8"
    )
    output = tmp_path / "out.de"
    output.write_text("the previous translation\n", encoding="utf-8")
    argv = [sys.executable, "-m", "nmt_cli.eval", "--path", tiny.checkpoint, "--beam", "5"]
    argv += ["--input", str(source), "--output", str(output), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with process_group(argv, env=env, stderr=subprocess.PIPE) as process:
        deadline = time.monotonic() + 120
        while not [name for name in os.listdir(tmp_path) if ".tmp-" in name]:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.0)  # translating into the temporary
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        seconds = time.monotonic() - signalled_at
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert "nmt-eval: terminated (SIGTERM)" in stderr
    assert seconds < STOP_SECONDS
    assert output.read_text(encoding="utf-8") == "the previous translation\n"
    assert sorted(os.listdir(tmp_path)) == ["out.de", "source.en"]  # no temporary behind


@pytest.mark.slow
def test_sigterm_mid_scoring_leaves_no_dataset_scores_or_temporary(tiny, tmp_path):
    """nmt-filter writes the kept dataset and the scores after scoring: stopped in it, neither
    they nor their work directory or temporary exist."""
    tiny_corpus(tmp_path, {"noisy": (30000, 5)}, **TINY_MODEL_PAIRS)
    spm_model = os.path.join(tiny.data_dir, "spm.model")
    tiny_dataset(tmp_path, train=["noisy"], valid=(), spm_model=spm_model)
    state = torch.load(tiny.checkpoint, weights_only=False)
    state["vocab"]["source_lang"], state["vocab"]["target_lang"] = "de", "en"
    reverse = tmp_path / "reverse.pt"  # the tiny model read backwards: a de->en model to score with
    torch.save(state, reverse)
    before = sorted(os.listdir(tmp_path))
    argv = [sys.executable, "-m", "nmt_cli.filter", str(tmp_path / "data"), "--device", "cpu"]
    argv += ["--forward", tiny.checkpoint, "--reverse", str(reverse), "--keep-fraction", "0.5"]
    argv += ["--destdir", str(tmp_path / "kept"), "--scores", str(tmp_path / "scores.txt")]
    log = tmp_path.parent / f"{tmp_path.name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as stderr, process_group(argv, env=env, stderr=stderr) as process:
        deadline = time.monotonic() + 120
        while "score (forward)" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(1.0)
        signalled_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        seconds = time.monotonic() - signalled_at
    text = log.read_text()
    assert process.returncode == 128 + signal.SIGTERM, text
    assert "nmt-filter: terminated (SIGTERM)" in text
    assert seconds < STOP_SECONDS
    assert sorted(os.listdir(tmp_path)) == before

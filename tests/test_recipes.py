"""The recipes' option handling, run with stub nmt-* commands that record their arguments."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BT_RECIPE = ROOT / "examples" / "multi30k-bt" / "run.sh"
MULTILINGUAL_RECIPE = ROOT / "examples" / "multi30k-multilingual" / "run.sh"


def _stub_commands(tmp_path: pathlib.Path) -> pathlib.Path:
    """nmt-train records its arguments and leaves a checkpoint in --save-dir (it refuses
    --bad-flag, as nmt-train refuses an unknown option). Each stub refuses a dataset or model
    path that does not exist, as the real commands do: a path split at a space fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exists = (
        'missing() { echo "$0: no such path: $1" >&2; exit 3; }\n'
        '[ -e "$1" ] || missing "$1"\n'
        'for arg in "$@"; do [ "$previous" = --path ] && { [ -e "$arg" ] || missing "$arg"; }; '
        'previous="$arg"; done\n'
    )
    (bin_dir / "nmt-train").write_text(
        f"#!/bin/sh\n{exists}echo \"$@\" >> '{tmp_path}/train-calls'\n"
        'case " $* " in *" --bad-flag "*) exit 2 ;; esac\n'
        "while [ $# -gt 0 ]; do\n"
        '    [ "$1" = --save-dir ] && mkdir -p "$2" && touch "$2/checkpoint_last.pt"\n'
        "    shift\n"
        "done\n"
        "exit 0\n"
    )
    # nmt-eval writes --output-dataset (a back-translation) and fails otherwise (the scoring), or
    # for a --path named *wrong*.
    (bin_dir / "nmt-eval").write_text(
        f"#!/bin/sh\n{exists}echo \"$@\" >> '{tmp_path}/eval-calls'\n"
        'case " $* " in *" --path "*wrong*) exit 1 ;; esac\n'  # a model nmt-eval refuses
        "while [ $# -gt 0 ]; do\n"
        '    if [ "$1" = --output-dataset ]; then\n'
        '        mkdir -p "$2" && echo "{}" > "$2/manifest.json"\n'
        "        echo 'back-translated 1 sentences' >&2 && exit 0\n"
        "    fi\n"
        "    shift\n"
        "done\n"
        "exit 1\n"
    )
    # nmt-export CHECKPOINT --quantization int8 --output-dir DIR --force
    (bin_dir / "nmt-export").write_text(
        f"#!/bin/sh\n{exists}echo \"$@\" >> '{tmp_path}/export-calls'\n"
        'mkdir -p "$5" && touch "$5/model.bin"\n'
    )
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return bin_dir


def _bt_out_dir(tmp_path: pathlib.Path, *, english: bool = False) -> pathlib.Path:
    """An output directory whose datasets, reverse model and back-translation exist (skipped);
    ``english``: the English captions' monolingual dataset too."""
    out = tmp_path / "out"
    datasets = ["data", "data-de-en", "mono-1", "bt-sample-tagged-c1"]
    if english:
        datasets.append("mono-en-1")
    for dataset in datasets:
        (out / dataset).mkdir(parents=True)
        (out / dataset / "manifest.json").write_text("{}")
    (out / "de-en").mkdir()
    (out / "de-en" / "checkpoint_last.pt").write_text("")
    (out / "de-en.done").write_text("")
    return out


def _run_bt_recipe(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    path = [
        str(_stub_commands(tmp_path)),
        str(pathlib.Path(sys.executable).parent),
        os.environ["PATH"],
    ]
    env = {**os.environ, "PATH": os.pathsep.join(path)}
    command = ["bash", str(BT_RECIPE), "--minutes", "1", "--out", str(tmp_path / "out"), *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


def test_bt_recipe_passes_flags_after_dashes_to_both_en_de_models(tmp_path):
    _bt_out_dir(tmp_path)
    _run_bt_recipe(tmp_path, "--baseline", "--", "--encoder-embed-dim", "192", "--lr", "*")
    calls = (tmp_path / "train-calls").read_text().splitlines()
    assert len(calls) == 2, calls  # the baseline, then the final model; de->en exists
    assert "/baseline " in calls[0] and "--train-subsets" in calls[1]
    for call in calls:
        assert call.endswith("--encoder-embed-dim 192 --lr *"), call


def test_bt_recipe_refuses_models_trained_with_other_flags(tmp_path):
    _bt_out_dir(tmp_path)
    _run_bt_recipe(tmp_path, "--baseline", "--", "--encoder-embed-dim", "192")
    calls_before = (tmp_path / "train-calls").read_text()

    for other in (["--", "--encoder-embed-dim", "256"], []):
        result = _run_bt_recipe(tmp_path, "--baseline", *other)
        assert result.returncode == 2
        wanted = " ".join(other[1:]) or "no flags"
        assert f"trained with [--encoder-embed-dim 192] after --, not [{wanted}]" in result.stderr
        assert str(tmp_path / "out") in result.stderr
    assert (tmp_path / "train-calls").read_text() == calls_before  # nothing trained again

    again = _run_bt_recipe(tmp_path, "--baseline", "--", "--encoder-embed-dim", "192")
    assert again.returncode != 2 and "use another --out" not in again.stderr


def test_bt_recipe_refuses_flags_over_models_trained_before_the_record(tmp_path):
    out = _bt_out_dir(tmp_path)
    (out / "baseline").mkdir()  # trained when -- was not an option: no flags
    (out / "baseline" / "checkpoint_last.pt").write_text("")

    result = _run_bt_recipe(tmp_path, "--baseline", "--", "--dropout", "0.3")

    assert result.returncode == 2
    assert "trained with [no flags] after --, not [--dropout 0.3]" in result.stderr
    assert not (tmp_path / "train-calls").exists()


def test_bt_recipe_refuses_other_budgets_and_de_en_flags_over_trained_models(tmp_path):
    out = _bt_out_dir(tmp_path)
    shutil.rmtree(out / "de-en")  # the recipe trains de->en, and records how
    (out / "de-en.done").unlink()
    _run_bt_recipe(tmp_path, "--baseline")
    calls_before = (tmp_path / "train-calls").read_text()
    assert calls_before.count("--save-dir") == 3

    for other, wanted in [
        (
            ["--minutes", "2"],
            "the en->de models in {out}: trained with --minutes 1, not --minutes 2",
        ),
        (
            ["--reverse-minutes", "2"],
            "the de->en model in {out}: trained with --reverse-minutes 1 --reverse-flags [], "
            "not --reverse-minutes 2 --reverse-flags []",
        ),
        (
            ["--reverse-flags", "--lr-scheduler cosine"],
            "trained with --reverse-minutes 1 --reverse-flags [], "
            "not --reverse-minutes 1 --reverse-flags [--lr-scheduler cosine]",
        ),
    ]:
        result = _run_bt_recipe(tmp_path, "--baseline", *other)
        assert result.returncode == 2, result.stderr
        assert wanted.format(out=out) in result.stderr and "use another --out" in result.stderr
    assert (tmp_path / "train-calls").read_text() == calls_before  # nothing trained again


def test_bt_recipe_lets_flags_change_after_nmt_train_refused_them(tmp_path):
    _bt_out_dir(tmp_path)
    refused = _run_bt_recipe(tmp_path, "--baseline", "--", "--bad-flag")
    assert refused.returncode == 2 and "use another --out" not in refused.stderr

    _run_bt_recipe(tmp_path, "--baseline", "--", "--encoder-embed-dim", "192")

    calls = (tmp_path / "train-calls").read_text().splitlines()
    assert len(calls) == 3, calls  # the refused baseline, then the baseline and the final model
    assert calls[1].endswith("--encoder-embed-dim 192") and calls[2].endswith(
        "--encoder-embed-dim 192"
    )


def test_bt_recipe_back_translates_iteratively_with_an_en_de_model(tmp_path):
    out = _bt_out_dir(tmp_path, english=True)
    teacher = tmp_path / "en-de.pt"
    teacher.write_text("")

    _run_bt_recipe(
        tmp_path, "--reverse-bt", str(teacher), "--reverse-flags", "--lr-scheduler cosine"
    )

    english, german, scoring = (tmp_path / "eval-calls").read_text().splitlines()
    assert english.startswith(f"{out}/mono-en-1 --path {teacher} ") and "--split train " in english
    assert (
        f"--output-dataset {out}/en-bt-sample-tagged-c1 " in english and "--tag-source" in english
    )
    reverse, final = (tmp_path / "train-calls").read_text().splitlines()
    # The de->en model learns from real and synthetic pairs, with its own flags; the round-one
    # de->en model in DIR/de-en is left alone.
    assert reverse.startswith(f"{out}/data-de-en ") and f"--save-dir {out}/de-en-ibt " in reverse
    assert f"--train-subsets train,{out}/en-bt-sample-tagged-c1/train --subset-weights 0.5,0.5" in (
        reverse
    )
    assert reverse.endswith("--lr-scheduler cosine")
    assert german.startswith(f"{out}/mono-1 --path {out}/de-en-ibt/checkpoint_last.pt ")
    assert f"--output-dataset {out}/bt-sample-tagged-c1-ibt " in german
    assert f"--train-subsets train,{out}/bt-sample-tagged-c1-ibt/train " in final
    assert "--lr-scheduler" not in final  # --reverse-flags are the de->en model's alone
    assert scoring.startswith(f"{out}/data --path {out}/bt-sample-tagged-c1-ibt-w0.5/")


EN_DE_MODEL_OPTIONS = pytest.mark.parametrize("option", ["--reverse-bt", "--forward-translate"])


@EN_DE_MODEL_OPTIONS
def test_bt_recipe_refuses_a_missing_en_de_model(tmp_path, option):
    _bt_out_dir(tmp_path)
    result = _run_bt_recipe(tmp_path, option, str(tmp_path / "nothing.pt"))
    assert result.returncode == 2
    assert f"{option} {tmp_path}/nothing.pt: no such checkpoint file" in result.stderr
    assert not (tmp_path / "train-calls").exists()


@EN_DE_MODEL_OPTIONS
def test_bt_recipe_refuses_another_en_de_model_over_the_same_out(tmp_path, option):
    out = _bt_out_dir(tmp_path, english=True)
    first, second = tmp_path / "first.pt", tmp_path / "second.pt"
    first.write_text("one model")
    second.write_text("another model")
    _run_bt_recipe(tmp_path, option, str(first))
    calls = (tmp_path / "eval-calls").read_text()

    result = _run_bt_recipe(tmp_path, option, str(second))

    assert result.returncode == 2
    assert f"{out} was built with another {option} model than {second}" in result.stderr
    assert (tmp_path / "eval-calls").read_text() == calls  # nothing reused, nothing redone


def test_bt_recipe_blends_forward_translated_english_captions(tmp_path):
    out = _bt_out_dir(tmp_path, english=True)
    teacher = tmp_path / "en-de.pt"
    teacher.write_text("")

    _run_bt_recipe(tmp_path, "--forward-translate", str(teacher), "--real-weight", "0.4")

    forward, scoring = (tmp_path / "eval-calls").read_text().splitlines()
    assert forward.startswith(f"{out}/mono-en-1 --path {teacher} --beam 5 --synthetic-side target ")
    assert f"--output-dataset {out}/ft-c1 " in forward and "--tag-source" not in forward
    (final,) = (tmp_path / "train-calls").read_text().splitlines()  # de->en exists
    assert f"--save-dir {out}/bt-sample-tagged-c1-ft-w0.4 " in final
    assert (
        f"--train-subsets train,{out}/bt-sample-tagged-c1/train,{out}/ft-c1/train "
        "--subset-weights 0.4,0.3,0.3" in final
    )
    assert scoring.startswith(f"{out}/data --path {out}/bt-sample-tagged-c1-ft-w0.4/")
    assert (out / "forward.sha256").read_text().split() == [
        subprocess.run(["sha256sum", str(teacher)], capture_output=True, text=True).stdout.split()[
            0
        ]
    ]


def test_bt_recipe_takes_paths_with_spaces(tmp_path):
    base = tmp_path / "my runs"
    base.mkdir()
    out = _bt_out_dir(base, english=True)
    teacher = base / "en-de model.pt"
    teacher.write_text("")

    result = _run_bt_recipe(
        base,
        "--baseline",
        "--ct2",
        "--reverse-bt",
        str(teacher),
        "--forward-translate",
        str(teacher),
    )

    assert "no such path" not in result.stderr, result.stderr
    exports = (base / "export-calls").read_text().splitlines()
    assert [call.split(" --quantization")[0] for call in exports] == [
        str(teacher),  # once: the export serves both the back- and the forward translation
        f"{out}/de-en-ibt/checkpoint_last.pt",
    ]
    evals = (base / "eval-calls").read_text().splitlines()
    assert len(evals) == 4, evals  # English BT, German BT, the forward translation, the scoring
    assert evals[-1].startswith(f"{out}/data --path {out}/baseline/checkpoint_last.pt ")
    assert (base / "train-calls").read_text().count("--save-dir") == 3  # de->en, baseline, final


def test_bt_recipe_without_the_tag(tmp_path):
    out = _bt_out_dir(tmp_path)

    _run_bt_recipe(tmp_path, "--no-tag")

    back_translation, scoring = (tmp_path / "eval-calls").read_text().splitlines()
    assert f"--output-dataset {out}/bt-sample-c1 " in back_translation
    assert "--tag-source" not in back_translation
    assert scoring.startswith(f"{out}/data --path {out}/bt-sample-c1-w0.5/")


def test_bt_recipe_takes_another_reverse_bt_model_after_one_was_refused(tmp_path):
    out = _bt_out_dir(tmp_path, english=True)
    wrong, right = tmp_path / "wrong-de-en.pt", tmp_path / "en-de.pt"
    wrong.write_text("a de->en model")
    right.write_text("an en->de model")
    refused = _run_bt_recipe(tmp_path, "--reverse-bt", str(wrong))
    assert refused.returncode == 1 and not (out / "en-bt-sample-tagged-c1").exists()

    _run_bt_recipe(tmp_path, "--reverse-bt", str(right))

    assert f"{out}/en-bt-sample-tagged-c1" in (tmp_path / "eval-calls").read_text().splitlines()[1]
    assert (tmp_path / "train-calls").read_text().count("--save-dir") == 2  # de->en, en->de


def _run_multilingual_recipe(
    tmp_path: pathlib.Path, minutes: str, *args: str
) -> subprocess.CompletedProcess:
    """The multilingual recipe over stubs: nmt-preprocess leaves a dataset in --destdir, nmt-eval
    prints scores in nmt-eval's format (and writes --output), nmt-train as above."""
    bin_dir = _stub_commands(tmp_path)
    (bin_dir / "nmt-preprocess").write_text(
        "#!/bin/sh\n"
        "while [ $# -gt 0 ]; do\n"
        '    [ "$1" = --destdir ] && mkdir -p "$2" && echo "{}" > "$2/manifest.json"\n'
        "    shift\n"
        "done\n"
    )
    (bin_dir / "nmt-eval").write_text(
        f"#!/bin/sh\necho \"$@\" >> '{tmp_path}/eval-calls'\n"
        "while [ $# -gt 0 ]; do\n"
        '    [ "$1" = --output ] && echo \'Ein Hund rennt über die Wiese.\' > "$2"\n'
        "    shift\n"
        "done\n"
        "printf 'BLEU = 30.00 60.0/40.0/30.0/20.0\\nchrF2 = 50.00\\noff-target 0.00%%\\n'\n"
    )
    (bin_dir / "nmt-preprocess").chmod(0o755)
    path = [str(bin_dir), str(pathlib.Path(sys.executable).parent), os.environ["PATH"]]
    env = {**os.environ, "PATH": os.pathsep.join(path)}
    command = ["bash", str(MULTILINGUAL_RECIPE), "--minutes", minutes, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)


WIDE = "--encoder-embed-dim 192 --decoder-embed-dim 192 --encoder-ffn-embed-dim 768"


@pytest.mark.parametrize(
    "minutes, wide, factor",
    [("30", True, "2"), ("59.9", True, "2"), ("60", True, "1.5"), ("20", False, "")],
)
def test_multilingual_recipe_widens_the_multilingual_model_alone_from_30_minutes(
    tmp_path, minutes, wide, factor
):
    out = tmp_path / "out"

    result = _run_multilingual_recipe(tmp_path, minutes, "--out", str(out))

    assert result.returncode == 0, result.stderr
    multi, *bilingual = (tmp_path / "train-calls").read_text().splitlines()
    assert multi.startswith(f"{out}/multi/data --save-dir {out}/multi/ckpt ")
    upsampled = f"--upsample-directions en-de:{factor},en-fr:{factor},en-cs:{factor}"
    assert (WIDE in multi and "--warmup-updates 1200" in multi and upsampled in multi) == wide, (
        multi
    )
    assert multi.count("--upsample-directions") == wide, multi
    assert len(bilingual) == 6 and not any(
        "--encoder-embed-dim" in call or "--upsample-directions" in call for call in bilingual
    )
    assert (out / "table.md").read_text().count("| 30.00 | 50.00 |") == 6 + 6 + 1


@pytest.mark.parametrize("minutes", ["abc", "0", "-5", "nan", "inf", "1e999"])
def test_multilingual_recipe_refuses_a_bad_budget_before_preprocessing(tmp_path, minutes):
    out = tmp_path / "out"

    result = _run_multilingual_recipe(tmp_path, minutes, "--out", str(out))

    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "examples/multi30k-multilingual/run.sh: --minutes must be a positive number, "
        f"not '{minutes}'"
    )
    assert not out.exists() and not (tmp_path / "train-calls").exists()


def test_multilingual_recipe_refuses_another_budget_over_trained_models(tmp_path):
    out = tmp_path / "out"
    _run_multilingual_recipe(tmp_path, "30", "--out", str(out), "--no-bilingual")
    calls_before = (tmp_path / "train-calls").read_text()

    for minutes in ("60", "6"):
        result = _run_multilingual_recipe(tmp_path, minutes, "--out", str(out))
        assert result.returncode == 2, result.stderr
        assert (
            f"the models in {out}: trained with --minutes 30, not --minutes {minutes}: "
            "use another --out" in result.stderr
        )
    assert (tmp_path / "train-calls").read_text() == calls_before  # nothing trained again

    again = _run_multilingual_recipe(tmp_path, "30", "--out", str(out))  # resumes, adds bilingual
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "train-calls").read_text().count("--save-dir") == 1 + 7

"""README.md's documented flags must exist, and its two commands must be the scripts we ship."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCHRUN_FLAGS = {"--nproc_per_node", "--max-restarts", "--rdzv-backend", "--rdzv-endpoint"}
RUFF_FLAGS = {"--check"}


def command_parsers():
    """Each console script's parser, by command name."""
    from nmt_cli.eval import build_parser as eval_parser
    from nmt_cli.export import build_parser as export_parser
    from nmt_cli.filter import build_parser as filter_parser
    from nmt_cli.import_model import build_parser as import_parser
    from nmt_cli.plot import build_parser as plot_parser
    from nmt_cli.preprocess import build_parser as preprocess_parser
    from nmt_cli.serve import build_parser as serve_parser
    from nmt_cli.train import build_parser as train_parser

    return {
        "nmt-preprocess": preprocess_parser(),
        "nmt-train": train_parser(),
        "nmt-eval": eval_parser(),
        "nmt-plot": plot_parser(),
        "nmt-export": export_parser(),
        "nmt-import": import_parser(),
        "nmt-serve": serve_parser(),
        "nmt-filter": filter_parser(),
    }


def parser_options():
    options = set()
    for parser in command_parsers().values():
        for action in parser._actions:
            options.update(action.option_strings)
    return options


def test_every_command_formats_its_help() -> None:
    """--help once crashed in nmt-eval: a help text's "%" read as a format directive by argparse."""
    parsers = command_parsers()
    scripts = re.findall(r'^(nmt-[\w-]+) = "nmt_cli\.', (ROOT / "pyproject.toml").read_text(), re.M)
    assert set(parsers) == set(scripts)
    helps = {command: parser.format_help() for command, parser in parsers.items()}
    assert all("--help" in text for text in helps.values())
    assert "% of outputs" in helps["nmt-eval"]


def script_options():
    """The options of the recipes (examples/*/run.py), of the benchmark scripts README quotes
    figures from, and of scripts/*.py (scripts/published.py --publish)."""
    scripts = [
        *(ROOT / "examples").glob("*/run.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "scripts").glob("*.py"),
    ]
    return {
        flag
        for path in scripts
        for flag in re.findall(
            r"add_argument\(\s*\"(--[a-z0-9-]+)\"", path.read_text(encoding="utf-8")
        )
    }


def test_every_documented_flag_exists():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    documented = (
        set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9_-]*", readme)) - TORCHRUN_FLAGS - RUFF_FLAGS
    )
    missing = sorted(documented - parser_options() - script_options())
    assert not missing, f"README documents flags no command has: {missing}"


def test_readme_opens_with_the_two_commands():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    assert [b.strip() for b in blocks[:2]] == ["bash scripts/main.sh", "bash scripts/test.sh"]
    for script in ("scripts/main.sh", "scripts/test.sh"):
        text = (ROOT / script).read_text(encoding="utf-8")
        assert "torch==2.13.0" in text  # pinned before anything pulls an unpinned torch
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_script = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert "ruff check ." in test_script and "ruff format --check ." in test_script

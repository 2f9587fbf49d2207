"""DESIGN.md's one-way dependencies: cli -> deploy -> eval; cli -> train, eval -> model, data -> config, dist, checkpoint_io."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "nmt/model": ("nmt.data", "nmt.train", "nmt.eval", "nmt.deploy", "nmt_cli"),
    "nmt/data": ("nmt.model", "nmt.train", "nmt.eval", "nmt.deploy", "nmt_cli"),
    "nmt/eval": ("nmt.train", "nmt.deploy", "nmt_cli"),
    "nmt/train": ("nmt.eval", "nmt.deploy", "nmt_cli"),
    "nmt/deploy": ("nmt.train", "nmt_cli"),
    "nmt/config.py": ("nmt.data", "nmt.model", "nmt.train", "nmt.eval", "nmt.deploy", "torch"),
    "nmt/dist.py": ("nmt.data", "nmt.model", "nmt.train", "nmt.eval", "nmt.deploy"),
}


def imported_modules(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_no_import_against_the_dependency_direction(part):
    target = ROOT / part
    files = [target] if target.is_file() else sorted(target.rglob("*.py"))
    assert files
    for path in files:
        for module in imported_modules(path):
            for forbidden in FORBIDDEN[part]:
                assert not (module == forbidden or module.startswith(forbidden + ".")), f"{path.relative_to(ROOT)} imports {module}"


def test_config_does_not_import_torch_at_import_time():
    import subprocess
    import sys

    code = "import sys, nmt.config, nmt; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

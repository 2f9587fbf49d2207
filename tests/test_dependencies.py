"""The one-way dependencies of docs/architecture.md: cli -> deploy -> eval; cli -> train, eval -> model,
data -> config, dist, checkpoint_io, fileio (cli -> command -> config, fileio); and no import cycle
between any two modules of nmt."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The ground floor's helpers import no other part of nmt, and not torch.
STDLIB_ONLY = (
    "nmt.config",
    "nmt.dist",
    "nmt.data",
    "nmt.model",
    "nmt.train",
    "nmt.eval",
    "nmt.deploy",
    "torch",
)
FORBIDDEN = {
    "nmt/model": ("nmt.data", "nmt.train", "nmt.eval", "nmt.deploy", "nmt_cli"),
    "nmt/data": ("nmt.model", "nmt.train", "nmt.eval", "nmt.deploy", "nmt_cli"),
    "nmt/eval": ("nmt.train", "nmt.deploy", "nmt_cli"),
    "nmt/train": ("nmt.eval", "nmt.deploy", "nmt_cli"),
    "nmt/deploy": ("nmt.train", "nmt_cli"),
    "nmt/config.py": ("nmt.data", "nmt.model", "nmt.train", "nmt.eval", "nmt.deploy", "torch"),
    "nmt/dist.py": ("nmt.data", "nmt.model", "nmt.train", "nmt.eval", "nmt.deploy"),
    "nmt/device.py": ("nmt.data", "nmt.model", "nmt.train", "nmt.eval", "nmt.deploy", "nmt.dist"),
    "nmt/checkpoint_io.py": (
        "nmt.data",
        "nmt.model",
        "nmt.train",
        "nmt.eval",
        "nmt.deploy",
        "nmt_cli",
    ),
    # The commands' shared machinery sits below every part it could serve (options come from configs).
    "nmt/command.py": STDLIB_ONLY[1:] + ("nmt_cli",),
    # Provenance sits beside the configs it reads, below every part that compares identities.
    "nmt/provenance.py": STDLIB_ONLY[1:] + ("nmt_cli",),
    "nmt/plot.py": (
        "nmt.data",
        "nmt.model",
        "nmt.train",
        "nmt.eval",
        "nmt.deploy",
        "nmt_cli",
        "torch",
    ),
    # The recipes' step runner sits on the library (data, eval, checkpoints), below the commands.
    "nmt/recipe.py": ("nmt.deploy", "nmt_cli"),
    "nmt/lazy.py": STDLIB_ONLY,
    "nmt/languages.py": STDLIB_ONLY,  # the ground floor of languages, below nmt.config
    "nmt/workers.py": STDLIB_ONLY,
    "nmt/fileio.py": STDLIB_ONLY,
    "nmt/results.py": STDLIB_ONLY,  # any script writes a results file without importing torch
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
                assert not (module == forbidden or module.startswith(forbidden + ".")), (
                    f"{path.relative_to(ROOT)} imports {module}"
                )


def test_config_does_not_import_torch_at_import_time():
    import subprocess
    import sys

    code = "import sys, nmt.config, nmt; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_inside_nmt():
    modules = {module_name(path): path for path in (ROOT / "nmt").rglob("*.py")}
    graph = {
        name: {
            m
            for m in imported_modules(path)
            if m in modules and m != name and not name.startswith(m + ".")
        }
        for name, path in modules.items()
    }
    done, stack = set(), []

    def visit(name: str) -> None:
        if name in stack:
            cycle = stack[stack.index(name) :] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        stack.append(name)
        for target in sorted(graph[name]):
            visit(target)
        stack.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)

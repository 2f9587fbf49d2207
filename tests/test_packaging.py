"""The package as pip and PyPI see it: every package directory is installed, the sdist holds the
sources, README, LICENSE and build files only (no tests or data) and builds a wheel, and no build
(sdist, wheel, editable: `pip install .`, `pip install -e .`) prints a packaging warning."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = "import sys; from setuptools import build_meta; print(getattr(build_meta, sys.argv[1])(sys.argv[2]))"
# Python's warning lines (path.py:215: SomeWarning: ..., InformationOnly included: pip prints those
# too) and distutils' (warning: no files found matching ...)
WARNING = re.compile(r"^\S+\.py:\d+: \w+: .*$|^.*\bwarning\b.*$", flags=re.I | re.M)


def installed_packages() -> list[str]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["packages"]


def test_every_package_directory_is_listed_in_pyproject() -> None:
    on_disk = {  # data directories too: setuptools warns about one left out (nmt.deploy.static)
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "nmt").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    listed = set(installed_packages())
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == {"nmt_cli"} and (ROOT / "cli" / "__init__.py").is_file()


def tracked_files() -> list[str]:
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs a git checkout (the sdist is checked on a copy of the tracked files)")
    return [name for name in listing.decode().split("\0") if name and (ROOT / name).is_file()]


def test_sdist_is_clean_and_builds_a_complete_wheel(tmp_path) -> None:
    files = tracked_files()
    checkout = tmp_path / "checkout"
    for name in files:  # a fresh clone: nothing untracked or built in the working tree
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    dist = tmp_path / "dist"
    dist.mkdir()

    # PYTHONDONTWRITEBYTECODE (set on some machines) makes distutils warn that it skips byte-compiling
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}

    def build(hook: str, cwd: pathlib.Path) -> str:
        result = subprocess.run(
            [sys.executable, "-c", BUILD, hook, str(dist)],
            cwd=cwd,
            capture_output=True,
            text=True,
            env=env,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        # what pip shows a user: the backend's Python warnings (pip >= 24 prints them)
        assert WARNING.findall(result.stdout + result.stderr) == [], f"{hook} in {cwd}"
        return result.stdout.strip().splitlines()[-1]

    sdist = dist / build("build_sdist", checkout)
    with tarfile.open(sdist) as archive:
        names = [member.name.split("/", 1)[1] for member in archive.getmembers() if member.isfile()]
        archive.extractall(tmp_path / "unpacked", filter="data")
    sources = {
        name for name in files if name.endswith(".py") and name.split("/")[0] in ("nmt", "cli")
    }
    sources |= {"nmt/deploy/static/index.html"}  # package data: nmt-serve's web page
    expected = sources | {
        "PKG-INFO",
        "pyproject.toml",
        "setup.py",
        "README.md",
        "LICENSE",
        "MANIFEST.in",
        "setup.cfg",  # setuptools' own, as in every setuptools sdist, and its egg-info below
    }
    metadata = {name for name in names if name.startswith("nmt.egg-info/")}
    assert sorted(set(names) - metadata) == sorted(expected)  # no tests, data, benchmarks...

    wheel = dist / build("build_wheel", next((tmp_path / "unpacked").iterdir()))
    # `pip install .` builds the wheel from the checkout, `pip install -e .` an editable one
    from_checkout = dist / build("build_wheel", checkout)
    editable = dist / build("build_editable", checkout)
    with zipfile.ZipFile(from_checkout) as archive:
        checkout_contents = set(archive.namelist())
    with zipfile.ZipFile(editable) as archive:
        assert any(name.endswith(".pth") for name in archive.namelist())
    with zipfile.ZipFile(wheel) as archive:
        contents = set(archive.namelist())
        metadata = archive.read(
            next(n for n in contents if n.endswith(".dist-info/METADATA"))
        ).decode()
        entry_points = archive.read(
            next(n for n in contents if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    assert {
        "nmt_cli/eval.py",
        "nmt_cli/plot.py",
        "nmt/plot.py",
        "nmt/eval/ensemble.py",
        "nmt/deploy/static/index.html",
    } <= contents
    assert checkout_contents == contents
    assert not any(name.startswith(("cli/", "tests/", "benchmarks/")) for name in contents)
    assert "License-Expression: MIT" in metadata and "Provides-Extra: plot" in metadata
    assert (
        "Requires-Dist: tensorboard" in metadata and 'extra == "tensorboard"' in metadata
    )  # optional, not core
    for command in (
        "nmt-preprocess",
        "nmt-train",
        "nmt-eval",
        "nmt-plot",
        "nmt-export",
        "nmt-serve",
    ):
        assert f"{command} = nmt_cli." in entry_points

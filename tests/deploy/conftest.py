"""The tiny trained model of tests/eval (a checkpoint of ours) and its CTranslate2 export."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from collections.abc import Iterator

import pytest

# --import-mode=importlib keeps test folders off sys.path: the tests import _serve_helpers through this.
sys.path.insert(0, os.path.dirname(__file__))


def _eval_conftest():
    """tests/eval/conftest.py as a module: its tiny-model recipe is shared, not copied."""
    name = "_nmt_tests_eval_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, pathlib.Path(__file__).parent.parent / "eval" / "conftest.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules[name]


eval_conftest = _eval_conftest()
one_thread = eval_conftest.one_thread
TinySetup = eval_conftest.TinySetup


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinySetup:
    with one_thread():
        return eval_conftest._make_tiny(tmp_path_factory.mktemp("deploy"))


@pytest.fixture(scope="session")
def exported(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny checkpoint exported to CTranslate2, float32."""
    from nmt.deploy.ct2 import export_ctranslate2

    output_dir = str(tmp_path_factory.mktemp("export") / "ct2")
    export_ctranslate2([tiny.checkpoint], output_dir)
    return output_dir

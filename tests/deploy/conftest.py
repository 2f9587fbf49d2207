"""The CTranslate2 export of the tiny trained model (tests/conftest.py's `tiny`, a checkpoint of ours)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from ..helpers import TinySetup, one_thread

# --import-mode=importlib keeps test folders off sys.path: the tests import _serve_helpers through this.
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="session")
def exported(tiny: TinySetup, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny checkpoint exported to CTranslate2, float32."""
    from nmt.deploy.ct2 import export_ctranslate2

    output_dir = str(tmp_path_factory.mktemp("export") / "ct2")
    export_ctranslate2([tiny.checkpoint], output_dir)
    return output_dir

"""One thread per eval test (helpers.one_thread says why); the tiny model is tests/conftest.py's `tiny`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..helpers import one_thread


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield

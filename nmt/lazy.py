"""Package namespaces that import their modules on first use (PEP 562): ``import nmt.data.spm`` or
``nmt.eval.translate`` then never pays for torch, which only some of their siblings need (the
CTranslate2 decoding path runs without it)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, modules: dict[str, list[str]]
) -> tuple[Callable[[str], Any], list[str]]:
    """``__getattr__`` and ``__all__`` for ``package``, whose names live in the given submodules."""
    owner = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(owner[name]), name)

    return __getattr__, sorted(owner, key=str.lower)

"""nmt: neural machine translation training toolkit."""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy: ``import nmt`` stays cheap (no torch); ``nmt.Translator`` imports the eval stack on first use.
    if name == "Translator":
        from nmt.eval.translate import Translator

        return Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")

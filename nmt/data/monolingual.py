"""Monolingual datasets (``nmt-preprocess --only-source``): one language's text, encoded with the
vocabulary of the models that will read it, stored once with both sides of the manifest naming the
same token file, so that every reader of parallel data (corpus, batching, scoring) reads it as is.
Back-translation (``nmt-eval --output-dataset``) turns one into a parallel dataset."""

from __future__ import annotations

from nmt.data.manifest import Manifest


def is_monolingual(manifest: Manifest) -> bool:
    return bool(manifest.config.get("only_source"))


def require_monolingual(manifest: Manifest, *, option: str) -> None:
    """One line unless ``manifest`` is a monolingual dataset (a parallel one has its own targets)."""
    if not is_monolingual(manifest):
        raise ValueError(
            f"{option} {manifest.directory}: a parallel dataset ({manifest.source_lang}-"
            f"{manifest.target_lang}); back-translation reads a monolingual one "
            "(nmt-preprocess --only-source)"
        )

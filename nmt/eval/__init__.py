"""Decoding and scoring: beam/greedy/sampling search, sacreBLEU, and the Translator API (each name
is imported on first use: an exported CTranslate2 model translates without torch)."""

from nmt.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "nmt.eval.ensemble": ["Ensemble"],
        "nmt.eval.score": ["Score", "score"],
        "nmt.eval.hypothesis": ["Hypothesis"],
        "nmt.eval.search": ["generate"],
        "nmt.checkpoint_io": ["load_averaged_checkpoint"],
        "nmt.eval.translate": ["Translator"],
    },
)

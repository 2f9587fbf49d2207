"""nmt: neural machine translation training toolkit."""

from nmt.lazy import lazy_exports

__version__ = "0.1.0"

# ``import nmt`` stays cheap (no torch); ``nmt.Translator`` imports the eval stack on first use.
__getattr__, _ = lazy_exports(__name__, {"nmt.eval.translate": ["Translator"]})

"""nmt: neural machine translation training toolkit."""

__version__ = "0.1.0"

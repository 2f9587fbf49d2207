"""Datasets, batching, curriculum, packing: numpy + sentencepiece; torch only where tensors are made."""

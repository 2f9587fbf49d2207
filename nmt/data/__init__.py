"""Datasets, batching, curriculum, packing: numpy + sentencepiece; torch only where tensors are made."""

from nmt.data.blend import BlendedCorpus, BlendedEpochs, build_blend_index, build_blend_index_distributed, load_or_build_blend_index, weights_from_temperature
from nmt.data.corpus import ParallelCorpus
from nmt.data.manifest import Manifest, load_manifest
from nmt.data.indexed import IndexedDataset, IndexedWriter
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SentencePieceModel
from nmt.data.text import DataError
from nmt.data.batching import BatchingOptions, Batches, MaxTokensBatchSampler, global_batches, shard
from nmt.data.collate import collate
from nmt.data.curriculum import competence, distributed_sample_sort
from nmt.data.packing import Packed, pack, pack_padded, partition_microbatches, restore_order, unpack

__all__ = [
    "Batches",
    "BatchingOptions",
    "BlendedCorpus",
    "BlendedEpochs",
    "BOS_ID",
    "build_blend_index",
    "build_blend_index_distributed",
    "collate",
    "competence",
    "DataError",
    "distributed_sample_sort",
    "EOS_ID",
    "global_batches",
    "IndexedDataset",
    "IndexedWriter",
    "load_manifest",
    "Manifest",
    "load_or_build_blend_index",
    "MaxTokensBatchSampler",
    "pack",
    "pack_padded",
    "Packed",
    "PAD_ID",
    "ParallelCorpus",
    "partition_microbatches",
    "restore_order",
    "SentencePieceModel",
    "shard",
    "UNK_ID",
    "unpack",
    "weights_from_temperature",
]

"""Datasets, batching, curriculum, packing, the training-data plan: numpy + sentencepiece; torch
only where tensors are made."""

from nmt.data.batching import Batches, MaxTokensBatchSampler, global_batches, shard
from nmt.data.blend import BlendedCorpus, BlendedEpochs, build_blend_index, load_or_build_blend_index, weights_from_temperature
from nmt.data.collate import collate
from nmt.data.corpus import ParallelCorpus
from nmt.data.curriculum import competence, distributed_sample_sort
from nmt.data.indexed import IndexedDataset, IndexedWriter
from nmt.data.manifest import Manifest, load_manifest
from nmt.data.packing import partition_microbatches, restore_order, unpack
from nmt.data.plan import MicroBatch, TrainingDataPlan, Update
from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SentencePieceModel
from nmt.data.text import DataError

__all__ = [
    "Batches",
    "BlendedCorpus",
    "BlendedEpochs",
    "BOS_ID",
    "build_blend_index",
    "collate",
    "competence",
    "DataError",
    "distributed_sample_sort",
    "EOS_ID",
    "global_batches",
    "IndexedDataset",
    "IndexedWriter",
    "load_manifest",
    "load_or_build_blend_index",
    "Manifest",
    "MaxTokensBatchSampler",
    "MicroBatch",
    "PAD_ID",
    "ParallelCorpus",
    "partition_microbatches",
    "restore_order",
    "SentencePieceModel",
    "shard",
    "TrainingDataPlan",
    "UNK_ID",
    "unpack",
    "Update",
    "weights_from_temperature",
]

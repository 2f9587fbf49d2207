"""Datasets, batching, curriculum, packing, the training-data plan: numpy + sentencepiece; torch
only where tensors are made (each name is imported on first use)."""

from nmt.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "nmt.data.batching": ["Batches", "global_batches", "shard"],
        "nmt.data.sampler": ["MaxTokensBatchSampler"],
        "nmt.data.blend": [
            "BlendedCorpus",
            "BlendedEpochs",
            "build_blend_index",
            "load_or_build_blend_index",
            "weights_from_temperature",
        ],
        "nmt.data.collate": ["collate"],
        "nmt.data.corpus": ["ParallelCorpus"],
        "nmt.data.curriculum": ["competence"],
        "nmt.data.sample_sort": ["distributed_sample_sort"],
        "nmt.data.indexed": ["IndexedDataset", "IndexedWriter"],
        "nmt.data.manifest": ["Manifest", "load_manifest"],
        "nmt.data.packing": ["partition_microbatches", "restore_order"],
        "nmt.data.plan": ["MicroBatch", "TrainingDataPlan", "Update"],
        "nmt.data.spm": ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "SentencePieceModel"],
        "nmt.data.text": ["DataError"],
    },
)

"""Task run on every rank of a GlooPool (module-level, so spawned workers can unpickle it)."""

from __future__ import annotations

import numpy as np
import torch.distributed as torch_dist

from nmt.data.blend import BlendedEpochs


def blended_epochs_on_rank(sizes, weights, num_samples, cache_dir, epochs):
    rank, world_size = torch_dist.get_rank(), torch_dist.get_world_size()
    with BlendedEpochs(
        sizes,
        weights,
        num_samples,
        seed=3,
        cache_dir=cache_dir,
        rank=rank,
        world_size=world_size,
        barrier=torch_dist.barrier,
    ) as blend:
        indices = [tuple(np.asarray(a) for a in blend.get(epoch)) for epoch in epochs]
    return indices, blend.parts_built, blend.num_prefetch_hits

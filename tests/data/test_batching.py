import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from nmt.config import BatchingConfig
from nmt.data.batching import (
    Batches,
    batch_tokens,
    global_batches,
    greedy_offsets,
    padding_efficiency,
    round_up,
    shard,
)
from nmt.data.curriculum import competence, difficulty_fractions, length_difficulty
from nmt.data.sampler import MaxTokensBatchSampler


def synthetic_lengths(num_samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = np.clip(rng.normal(14, 5, num_samples), 1, 60).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.1, 0.2, num_samples), 1, 70).astype(np.int64)
    return src, tgt


SRC, TGT = synthetic_lengths(3000)


def batch_cost(batch: np.ndarray, cfg: BatchingConfig, length_multiple: int) -> int:
    src = round_up(SRC[batch], length_multiple)
    tgt = round_up(TGT[batch], length_multiple)
    if cfg.packed:
        return int(max(src.sum(), tgt.sum()))
    return int(len(batch) * max(src.max(), tgt.max()))


def assert_each_sample_once(batches: list[np.ndarray], num_samples: int) -> None:
    flat = np.concatenate(batches)
    assert flat.shape[0] == num_samples
    np.testing.assert_array_equal(np.sort(flat), np.arange(num_samples))


config_strategy = st.builds(
    BatchingConfig,
    max_tokens=st.integers(min_value=280, max_value=5000),
    batch_noise=st.sampled_from([0.0, 0.1, 0.3]),
    noise_mode=st.sampled_from(["ties", "length"]),
    required_batch_size_multiple=st.sampled_from([1, 3, 8]),
    max_sentences=st.sampled_from([None, 1, 7, 100]),
    layout=st.sampled_from(["padded", "packed"]),
)
# What global_batches takes besides the config.
call_strategy = st.fixed_dictionaries(
    {
        "shuffle": st.booleans(),
        "seed": st.integers(0, 5),
        "length_multiple": st.sampled_from([1, 4]),
    }
)


@settings(max_examples=40, deadline=None)
@given(cfg=config_strategy, call=call_strategy, epoch=st.integers(0, 3))
def test_budget_never_exceeded_and_no_sample_lost(cfg, call, epoch):
    batches = global_batches(SRC, TGT, cfg, epoch=epoch, **call).to_list()
    assert_each_sample_once(batches, SRC.shape[0])
    for batch in batches:
        assert batch_cost(batch, cfg, call["length_multiple"]) <= cfg.max_tokens
        if cfg.max_sentences is not None:
            assert len(batch) <= cfg.max_sentences


@settings(max_examples=20, deadline=None)
@given(cfg=config_strategy, call=call_strategy, world=st.integers(1, 5))
def test_ranks_get_disjoint_shards_with_equal_step_counts(cfg, call, world):
    batches = global_batches(SRC, TGT, cfg, epoch=1, **call)
    shards = [shard(batches, num_replicas=world, rank=r) for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    assert_each_sample_once([b for s in shards for b in s.to_list()], SRC.shape[0])
    assert sum(int((s.sizes == 0).sum()) for s in shards) < world  # dummies only pad the tail


@pytest.mark.parametrize("world,update_freq", [(1, 1), (2, 3), (3, 2), (4, 1), (5, 4)])
def test_world_ranks_times_accumulation_see_the_batches_of_one_rank(world, update_freq):
    reference = global_batches(
        SRC, TGT, BatchingConfig(layout="padded", max_tokens=1500), seed=0, epoch=2
    )
    per_update = world * update_freq
    # The sampler's load-balanced deal may reorder a step's batches over ranks, never across steps.
    shards = [
        shard(reference, num_replicas=world, rank=r, sample_tokens=SRC + TGT).to_list()
        for r in range(world)
    ]
    num_updates = -(-len(shards[0]) // update_freq)
    for update in range(num_updates):
        seen = [
            b.tolist()
            for r in range(world)
            for b in shards[r][update * update_freq : (update + 1) * update_freq]
            if b.size
        ]
        positions = range(update * per_update, min((update + 1) * per_update, len(reference)))
        expected = [reference[i].tolist() for i in positions]
        assert sorted(seen) == sorted(expected)


def test_same_seed_and_epoch_give_the_same_batches_and_epochs_differ():
    cfg = BatchingConfig(layout="padded", max_tokens=4096)
    first = global_batches(SRC, TGT, cfg, seed=0, epoch=3).to_list()
    again = global_batches(SRC.copy(), TGT.copy(), cfg, seed=0, epoch=3).to_list()
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    other = global_batches(SRC, TGT, cfg, seed=0, epoch=4).to_list()
    other_sets = {frozenset(b.tolist()) for b in other}
    changed = sum(frozenset(b.tolist()) not in other_sets for b in first)
    assert changed >= 0.9 * len(first)


def test_ties_mode_keeps_length_order_and_padding_low():
    batches = global_batches(
        SRC, TGT, BatchingConfig(layout="padded", max_tokens=512), seed=0, epoch=0, shuffle=False
    )
    longest = np.maximum(SRC, TGT)
    key = longest[batches.indices]
    assert (np.diff(key) >= 0).all()  # unshuffled: batches are consecutive runs of the sorted order
    assert padding_efficiency(batches, SRC, TGT) > 0.9
    noisy = global_batches(
        SRC,
        TGT,
        BatchingConfig(layout="padded", max_tokens=512, noise_mode="length", batch_noise=0.3),
        seed=0,
        epoch=0,
    )
    assert padding_efficiency(noisy, SRC, TGT) < padding_efficiency(batches, SRC, TGT)


def test_zero_noise_gives_the_same_composition_every_epoch():
    cfg = BatchingConfig(layout="padded", max_tokens=2048, batch_noise=0.0)
    sets = [
        {frozenset(b.tolist()) for b in global_batches(SRC, TGT, cfg, seed=0, epoch=e).to_list()}
        for e in range(3)
    ]
    assert sets[0] == sets[1] == sets[2]


def test_greedy_keeps_the_remainder_of_a_size_multiple_instead_of_dropping_it():
    lengths = np.full(10, 5)
    offsets = greedy_offsets(lengths, lengths, 40, packed=False, batch_size_multiple=3)
    np.testing.assert_array_equal(np.diff(offsets), [6, 3, 1])  # 8 fit; 6 kept, 2 carried over


def test_greedy_respects_breaks():
    lengths = np.full(10, 2)
    offsets = greedy_offsets(lengths, lengths, 100, packed=True, breaks=np.array([4]))
    np.testing.assert_array_equal(offsets, [0, 4, 10])


def test_too_long_sample_is_an_error_naming_it():
    src, tgt = np.array([3, 9, 4]), np.array([3, 2, 40])
    with pytest.raises(ValueError, match="sample 2"):
        MaxTokensBatchSampler(src, tgt, BatchingConfig(layout="padded", max_tokens=30), seed=0)
    with pytest.raises(ValueError, match="sample 1"):
        global_batches(
            src,
            tgt,
            BatchingConfig(layout="padded", max_tokens=8),
            seed=0,
            epoch=0,
            length_multiple=8,
        )


@pytest.mark.parametrize(
    "options,kwargs,name",
    [
        ({"noise_mode": "x"}, {}, "--noise-mode"),
        ({"max_sentences": 0}, {}, "--max-sentences"),
        ({"batch_noise": 1.5}, {}, "--batch-noise"),
        ({}, {"rank": 2}, "rank"),
    ],
)
def test_bad_options_name_the_option(options, kwargs, name):
    with pytest.raises(ValueError, match=name):
        MaxTokensBatchSampler(
            SRC, TGT, BatchingConfig(layout="padded", max_tokens=1000, **options), seed=0, **kwargs
        )


def test_sampler_resumes_mid_epoch_with_the_remaining_batches():
    sampler = MaxTokensBatchSampler(
        SRC, TGT, BatchingConfig(layout="padded", max_tokens=1024), num_replicas=3, rank=1, seed=7
    )
    sampler.set_epoch(2)
    full = list(sampler)
    assert len(full) == len(sampler)
    iterator = iter(sampler)
    head = [next(iterator) for _ in range(5)]
    state = sampler.state_dict()
    resumed = MaxTokensBatchSampler(
        SRC, TGT, BatchingConfig(layout="padded", max_tokens=1024), num_replicas=3, rank=1, seed=7
    )
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    assert list(resumed) == full  # the next pass starts the epoch over


def test_state_dict_can_record_what_the_trainer_consumed_behind_prefetching():
    sampler = MaxTokensBatchSampler(
        SRC, TGT, BatchingConfig(layout="padded", max_tokens=1024), seed=0
    )
    iterator = iter(sampler)
    fetched = [next(iterator) for _ in range(6)]  # a DataLoader fetched 6, the trainer used 4
    state = sampler.state_dict(consumed=4)
    assert state["position"] == 4 and sampler.state_dict()["position"] == 6
    resumed = MaxTokensBatchSampler(
        SRC, TGT, BatchingConfig(layout="padded", max_tokens=1024), seed=0
    )
    resumed.load_state_dict(state)
    assert list(resumed)[:2] == fetched[4:]


def test_sampler_drives_a_dataloader_including_dummy_batches():
    samplers = [
        MaxTokensBatchSampler(
            SRC[:50],
            TGT[:50],
            BatchingConfig(layout="padded", max_tokens=4096),
            seed=0,
            num_replicas=4,
            rank=r,
        )
        for r in range(4)
    ]
    total = len(samplers[0].global_batches())
    steps = -(-total // 4)
    per_rank = [
        list(DataLoader(list(range(50)), batch_sampler=s, collate_fn=lambda items: items))
        for s in samplers
    ]
    assert [len(batches) for batches in per_rank] == [len(s) for s in samplers] == [steps] * 4
    assert sum(b == [] for batches in per_rank for b in batches) == 4 * steps - total
    assert_each_sample_once(
        [np.array(b, dtype=np.int64) for batches in per_rank for b in batches], 50
    )


def test_sampler_balances_rank_token_loads():
    src, tgt = synthetic_lengths(20_000, seed=1)  # ~150 steps of 8 ranks: enough to even out
    tokens = src + tgt
    batches = global_batches(
        src, tgt, BatchingConfig(layout="padded", max_tokens=1024), seed=0, epoch=0
    )
    for world in (2, 3, 8):
        plain = [
            int(batch_tokens(shard(batches, num_replicas=world, rank=r), tokens).sum())
            for r in range(world)
        ]
        balanced = [
            int(
                batch_tokens(
                    shard(batches, num_replicas=world, rank=r, sample_tokens=tokens), tokens
                ).sum()
            )
            for r in range(world)
        ]
        assert sum(balanced) == sum(plain) == tokens.sum()
        assert max(balanced) / min(balanced) < 1.02
        assert max(balanced) - min(balanced) <= max(plain) - min(plain)


def test_curriculum_epochs_run_easy_to_hard_then_shuffle():
    sampler = MaxTokensBatchSampler(
        SRC,
        TGT,
        BatchingConfig(layout="padded", max_tokens=2048, curriculum_epochs=2),
        seed=0,
        difficulty=length_difficulty(SRC, TGT),
    )
    fractions = difficulty_fractions(np.maximum(SRC, TGT).astype(float))
    hardest = [fractions[b].max() for b in sampler]
    assert hardest == sorted(hardest)
    sampler.set_epoch(2)
    hardest = [fractions[b].max() for b in sampler]
    assert hardest != sorted(hardest)


def test_score_curriculum_keeps_batches_inside_difficulty_bins():
    scores = np.random.default_rng(1).random(SRC.shape[0])  # unrelated to length
    cfg = BatchingConfig(layout="padded", max_tokens=2048, curriculum_bins=5, curriculum_epochs=1)
    batches = global_batches(SRC, TGT, cfg, seed=0, epoch=0, difficulty=scores).to_list()
    bins = np.floor(difficulty_fractions(scores) * 5 - 1e-9).astype(int)
    assert all(len(set(bins[b].tolist())) == 1 for b in batches)
    assert [bins[b][0] for b in batches] == sorted(bins[b][0] for b in batches)


def test_competence_admits_only_the_easiest_fraction_at_each_update():
    total_updates, world, update_freq = 40, 2, 2
    cfg = BatchingConfig(
        max_tokens=1024,
        curriculum_epochs=0,
        competence_updates=total_updates,
        competence_initial=0.1,
        update_freq=update_freq,
    )
    sampler = MaxTokensBatchSampler(
        SRC, TGT, cfg, seed=0, difficulty=length_difficulty(SRC, TGT), num_replicas=world
    )
    batches = sampler.global_batches().to_list()
    fractions = difficulty_fractions(np.maximum(SRC, TGT).astype(float))
    allowed = competence(
        np.arange(len(batches)) // (world * update_freq), total_updates=total_updates, initial=0.1
    )
    hardest = np.array([fractions[b].max() for b in batches])
    assert (hardest[1:] <= allowed[1:] + 1e-12).all()
    assert_each_sample_once(
        list({frozenset(b.tolist()): b for b in batches}.values()), SRC.shape[0]
    )
    # Past the competence horizon the epoch is a plain shuffle: no repeats.
    sampler.set_epoch(5, start_update=total_updates)
    assert_each_sample_once(sampler.global_batches().to_list(), SRC.shape[0])


def test_batches_take_and_dummies():
    batches = Batches(np.array([5, 6, 7, 8]), np.array([0, 2]), np.array([2, 4]))
    taken = batches.take(np.array([1, -1, 0]))
    assert [b.tolist() for b in taken.to_list()] == [[7, 8], [], [5, 6]]

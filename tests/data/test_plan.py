"""The training-data plan: world-size invariance, exact resume, difficulty aligned to samples."""

import numpy as np
import pytest

from nmt.config import BatchingConfig, DataConfig
from nmt.data.plan import TrainingDataPlan


def plan_for(data_dir, *, world_size=1, rank=0, update_freq=1, **data):
    batching = BatchingConfig(
        layout="padded", max_tokens=256, update_freq=update_freq, **data.pop("batching", {})
    )
    return TrainingDataPlan(
        DataConfig(data_dir=data_dir, batching=batching, **data),
        seed=3,
        rank=rank,
        world_size=world_size,
    )


def epoch_updates(plan):
    """Per update of the current epoch: (samples of this rank, global tokens, global sentences, seeds)."""
    plan.begin_epoch()
    return [
        (
            sorted(
                int(i) for micro in update.micro_batches if not micro.dummy for i in micro.indices
            ),
            update.num_tokens,
            update.num_sentences,
            sorted(micro.seed for micro in update.micro_batches if not micro.dummy),
        )
        for update in plan.updates()
    ]


@pytest.mark.parametrize("world_size,update_freq", [(2, 1), (3, 2)])
def test_w_ranks_times_u_steps_get_the_updates_of_one_rank_times_wu(
    tiny_data, world_size, update_freq
):
    one = epoch_updates(plan_for(tiny_data, update_freq=world_size * update_freq))
    ranks = [
        epoch_updates(plan_for(tiny_data, world_size=world_size, rank=r, update_freq=update_freq))
        for r in range(world_size)
    ]
    assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) == len(
        one
    )  # every rank steps together
    for k, (samples, tokens, sentences, seeds) in enumerate(one):
        assert sorted(i for r in ranks for i in r[k][0]) == samples
        assert all(
            r[k][1] == tokens and r[k][2] == sentences for r in ranks
        )  # one normaliser everywhere
        assert sorted(s for r in ranks for s in r[k][3]) == seeds  # dropout seeds follow the data


def test_resume_mid_epoch_hands_out_the_remaining_updates(tiny_data):
    reference = epoch_updates(plan_for(tiny_data, update_freq=2))
    plan = plan_for(tiny_data, update_freq=2)
    plan.begin_epoch()
    stream = plan.updates()
    for _ in range(3):
        next(stream)
    state = plan.state_dict()
    resumed = plan_for(tiny_data, update_freq=2)
    resumed.load_state_dict(state)
    assert epoch_updates(resumed) == reference[3:]


def test_epochs_differ_and_competence_counts_updates_across_epochs(tiny_data):
    plan = plan_for(tiny_data, curriculum="length", batching=dict(competence_updates=50))
    first = epoch_updates(plan)
    plan.end_epoch()
    assert plan.state_dict() == {"epoch": 1, "epoch_start_update": len(first), "updates_done": 0}
    assert epoch_updates(plan) != first


def write_scores(path, values):
    path.write_text("".join(f"{v}\n" for v in values))
    return f"file:{path}"


def test_curriculum_scores_stay_aligned_to_samples_with_a_blend(tiny_data, tmp_path):
    """One corpus with --subset-weights turns the blend on; the score of a raw line must follow its
    pair into whatever slot the blend puts it (the scores are a permutation of the line numbers)."""
    num_lines = plan_for(tiny_data).corpora[0].entry.num_lines
    line_scores = np.random.default_rng(5).permutation(num_lines).astype(float)
    spec = write_scores(tmp_path / "scores.txt", line_scores)
    plan = plan_for(
        tiny_data, subset_weights=(1.0,), curriculum=spec, batching=dict(curriculum_epochs=1)
    )
    epoch = plan.current
    corpus = plan.corpora[0]
    assert not np.array_equal(epoch.dataset.sample_ids, np.arange(len(corpus)))  # really reordered
    expected = line_scores[np.asarray(corpus.line_numbers)[np.asarray(epoch.dataset.sample_ids)]]
    np.testing.assert_array_equal(epoch.difficulty, expected)
    # The curriculum epoch runs its batches from easy to hard by the file's scores.
    hardest = [expected[b].max() for b in epoch.rank_batches.to_list()]
    assert hardest == sorted(hardest)


def test_one_score_file_per_blended_corpus(two_corpus_data, tmp_path):
    plan = plan_for(two_corpus_data, train_subsets=("train", "train1"))
    scores = [
        np.arange(c.entry.num_lines, dtype=float) + 1000 * k for k, c in enumerate(plan.corpora)
    ]
    files = [write_scores(tmp_path / f"s{k}.txt", s)[len("file:") :] for k, s in enumerate(scores)]
    plan = plan_for(
        two_corpus_data, train_subsets=("train", "train1"), curriculum="file:" + ",".join(files)
    )
    epoch = plan.current
    expected = [
        scores[c][np.asarray(plan.corpora[c].line_numbers)[s]]
        for c, s in zip(epoch.dataset.corpus_ids, epoch.dataset.sample_ids)
    ]
    np.testing.assert_array_equal(epoch.difficulty, expected)
    with pytest.raises(ValueError, match="one score file per --train-subsets entry"):
        DataConfig(
            data_dir=two_corpus_data,
            train_subsets=("train", "train1"),
            curriculum=f"file:{files[0]}",
        )


def test_static_shapes_hold_every_batch(tiny_data):
    plan = TrainingDataPlan(
        DataConfig(
            data_dir=tiny_data,
            batching=BatchingConfig(layout="padded", max_tokens=256, length_multiple=16),
        ),
        seed=3,
        static_shapes=True,
    )
    shapes = set(plan.static.shapes)
    plan.begin_epoch()
    for update in plan.updates():
        for micro in update.micro_batches:
            assert tuple(micro.batch["src_tokens"].shape) in shapes
            assert micro.batch["src_tokens"].shape == micro.batch["target"].shape


def test_long_samples_are_refused_for_training_and_truncated_for_validation(
    long_valid_data, caplog
):
    data_dir = long_valid_data  # its 4th validation pair is longer than any position below
    with pytest.raises(
        ValueError, match="--max-source-positions 8: the training data has samples of"
    ):
        TrainingDataPlan(DataConfig(data_dir=data_dir), seed=1, max_positions=(8, 1024))
    plan = TrainingDataPlan(
        DataConfig(data_dir=data_dir, batching=BatchingConfig(layout="padded", max_tokens=512)),
        seed=1,
        max_positions=(64, 48),
    )
    assert "1 of 10 validation pairs are longer" in caplog.text
    batches = list(plan.valid_batches())
    assert sum(b["src_lengths"].shape[0] for b in batches) == 10  # nothing dropped
    assert max(int(b["src_tokens"].shape[1]) for b in batches) == 64
    assert max(int(b["target"].shape[1]) for b in batches) == 48

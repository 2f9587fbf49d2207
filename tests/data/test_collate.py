import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data.collate import collate

PAD, BOS, EOS = 0, 1, 2


def sample(src: list[int], tgt: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(src + [EOS], dtype=np.int32), np.array(tgt + [EOS], dtype=np.int32)


SAMPLES = [sample([5, 6], [7]), sample([9], [4, 5, 6])]


def test_padded_layout():
    batch = collate(SAMPLES)
    assert batch["src_tokens"].tolist() == [[5, 6, EOS], [9, EOS, PAD]]
    assert batch["target"].tolist() == [[7, EOS, PAD, PAD], [4, 5, 6, EOS]]
    assert batch["prev_output_tokens"].tolist() == [[BOS, 7, PAD, PAD], [BOS, 4, 5, 6]]
    assert batch["src_lengths"].tolist() == [3, 2] and batch["tgt_lengths"].tolist() == [2, 4]
    # real target tokens in the flattened (B, T) target
    assert batch["target_index"].tolist() == [0, 1, 4, 5, 6, 7]
    assert batch["target"].reshape(-1)[batch["target_index"]].tolist() == [7, EOS, 4, 5, 6, EOS]
    assert all(v.dtype == torch.int64 for k, v in batch.items())


def test_packed_layout():
    batch = collate(SAMPLES, layout="packed")
    assert batch["src_tokens"].tolist() == [5, 6, EOS, 9, EOS]
    assert batch["target"].tolist() == [7, EOS, 4, 5, 6, EOS]
    assert batch["prev_output_tokens"].tolist() == [BOS, 7, BOS, 4, 5, 6]
    assert (
        batch["tgt_cu_seqlens"].tolist() == [0, 2, 6]
        and batch["tgt_cu_seqlens"].dtype == torch.int32
    )
    assert batch["src_positions"].tolist() == [0, 1, 2, 0, 1]
    assert batch["tgt_positions"].tolist() == [0, 1, 0, 1, 2, 3]
    assert batch["target_index"].tolist() == list(range(6))


token_lists = st.lists(st.integers(min_value=3, max_value=50), max_size=6)


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.lists(st.tuples(token_lists, token_lists), max_size=6),
    multiple=st.sampled_from([1, 8]),
    extra_rows=st.integers(0, 2),
)
def test_packed_unpacks_to_padded(pairs, multiple, extra_rows):
    samples = [sample(s, t) for s, t in pairs]
    rows = len(samples) + extra_rows
    padded = collate(samples, length_multiple=multiple, pad_rows_to=rows)
    packed = collate(samples, layout="packed", length_multiple=multiple, pad_rows_to=rows)
    assert padded["src_tokens"].shape[0] == rows and padded["target"].shape[1] % multiple == 0
    assert packed["target"].shape[0] % multiple == 0
    for key, side in [("src_tokens", "src"), ("prev_output_tokens", "tgt"), ("target", "tgt")]:
        assert torch.equal(packed[f"{side}_lengths"], padded[f"{side}_lengths"])
        width = padded[key].shape[1]
        assert torch.equal(to_padded(packed[key], packed[f"{side}_lengths"], width), padded[key])
    # Extra rows are empty samples whose targets are all padding.
    assert (padded["target"][len(samples) :] == PAD).all()
    # Both layouts point the loss at the same target tokens, and at no padding.
    real_padded = padded["target"].reshape(-1)[padded["target_index"]]
    assert torch.equal(packed["target"][packed["target_index"]], real_padded)
    assert real_padded.shape[0] == sum(len(t) + 1 for _, t in pairs) and (real_padded != PAD).all()


def to_padded(tokens: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
    rows = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)
    columns = torch.cat(
        [torch.arange(int(n)) for n in lengths] + [torch.zeros(0, dtype=torch.int64)]
    )
    out = torch.full((lengths.shape[0], width), PAD, dtype=tokens.dtype)
    out[rows, columns] = tokens[: rows.shape[0]]
    return out


def test_static_shapes_for_compilation():
    batch = collate(SAMPLES, layout="packed", pad_rows_to=4, pad_tokens_to=16)
    assert batch["src_tokens"].shape == (16,) and batch["target"].shape == (16,)
    assert batch["src_cu_seqlens"].tolist() == [0, 3, 5, 5, 5]
    assert (batch["target"][6:] == PAD).all() and (batch["tgt_positions"][6:] == 0).all()
    padded = collate(SAMPLES, pad_rows_to=4, pad_tokens_to=8)
    assert padded["src_tokens"].shape == (4, 8) and padded["target"].shape == (4, 8)
    with pytest.raises(ValueError, match="pad_rows_to"):
        collate(SAMPLES, pad_rows_to=1)
    with pytest.raises(ValueError, match="pad_tokens_to"):
        collate(SAMPLES, layout="packed", pad_tokens_to=4)


def test_empty_batches_and_empty_samples():
    dummy = collate([], pad_rows_to=2)
    assert dummy["target"].shape == (2, 1) and (dummy["target"] == PAD).all()
    assert dummy["target_index"].shape == (0,)  # nothing for the loss
    packed = collate([], layout="packed")
    assert packed["target"].shape == (0,) and packed["tgt_cu_seqlens"].tolist() == [0]
    empty_target = collate([(np.array([4, EOS]), np.array([], dtype=np.int64))])
    assert empty_target["tgt_lengths"].tolist() == [0]


def test_bad_inputs_name_the_sample_or_option():
    with pytest.raises(ValueError, match="sample 1"):
        collate([SAMPLES[0], (np.array([[1, 2]]), np.array([2]))])
    with pytest.raises(ValueError, match="layout"):
        collate(SAMPLES, layout="ragged")

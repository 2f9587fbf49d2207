"""SentencePiece: training, loading, encoding, decoding. The special ids live here and only here.

Convention (recorded in every manifest): source = pieces + EOS; target = pieces + EOS; the decoder
reads BOS + target[:-1] (built at collate time), so BOS is never stored on disk.
"""

from __future__ import annotations

import functools
import io
import itertools
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as sentencepiece_lib

from nmt.languages import language_tag
from nmt.workers import run_in_child

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
SPECIAL_IDS = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}

# Tags: pieces reserved in every vocabulary nmt-preprocess trains, as SentencePiece control symbols,
# so text never encodes to one (a tag typed inside a sentence stays text) and decoding drops them
# (never in any output); they enter a sequence by id only. ``<2xx>``: "into language xx", one per
# language of the dataset (multilingual models); ``<bt>``: a synthetic (back-translated) source;
# ``<term>``: a target term follows in the source (``nmt.data.terminology``).
BT_TAG = "<bt>"
TERM_TAG = "<term>"


def reserved_tags(languages: Iterable[str]) -> list[str]:
    """The tags a vocabulary over ``languages`` reserves, in id order."""
    return [language_tag(lang) for lang in sorted(set(languages))] + [BT_TAG, TERM_TAG]


def train_model(
    sentences: Iterable[str],
    *,
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    num_threads: int,
    tags: Sequence[str] = (),
    label: str = "the training sample",
) -> bytes:
    """Train a SentencePiece model on ``sentences`` and return its serialized proto; ``tags``
    become control symbols (ids right after the special ids).

    ``hard_vocab_limit=False`` lets a small corpus yield a smaller vocabulary instead of failing;
    the real size is read back from the model and recorded. SentencePiece's own errors (degenerate
    text) become one ``ValueError`` naming ``label``.
    """
    train = functools.partial(
        _train,
        sentence_iterator=iter(sentences),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        control_symbols=list(tags),
        hard_vocab_limit=False,
        num_threads=num_threads,
        minloglevel=2,
    )
    try:
        # Minutes in C on a large sample: aside, so that a signal to this process stops it at once.
        return run_in_child(train, what=f"SentencePiece training on {label}")
    except RuntimeError as error:
        # e.g. "Internal: src/trainer_interface.cc(...) [!sentences_.empty()]" when every sentence is
        # longer than SentencePiece's limit (4,192 bytes) or the text has too few distinct characters.
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(
            f"SentencePiece training failed on {label}: {reason} (it skips sentences over 4,192 bytes "
            "and needs ordinary text: check the training files)"
        ) from None


def _train(**options: object) -> bytes:
    model = io.BytesIO()
    sentencepiece_lib.SentencePieceTrainer.train(model_writer=model, **options)
    return model.getvalue()


class SentencePieceModel:
    """A loaded model; checks that its special ids are the toolkit's."""

    def __init__(self, proto: bytes, *, name: str = "<in memory>") -> None:
        try:
            self.processor = sentencepiece_lib.SentencePieceProcessor(model_proto=proto)
        except Exception as error:  # sentencepiece raises bare RuntimeError/OSError variants
            raise ValueError(f"{name}: not a SentencePiece model ({error})") from None
        found = {
            "pad": self.processor.pad_id(),
            "bos": self.processor.bos_id(),
            "eos": self.processor.eos_id(),
            "unk": self.processor.unk_id(),
        }
        if found != SPECIAL_IDS:
            raise ValueError(f"{name}: special ids {found} differ from the toolkit's {SPECIAL_IDS}")
        self.proto = proto
        self.name = name

    @classmethod
    def load(cls, path: str) -> SentencePieceModel:
        try:
            with open(path, "rb") as handle:
                proto = handle.read()
        except OSError as error:
            raise ValueError(f"{path}: cannot read SentencePiece model: {error}") from None
        return cls(proto, name=path)

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    @property
    def tags(self) -> dict[str, int]:
        """The reserved tags (control pieces other than the special ids) and their ids."""
        specials = set(SPECIAL_IDS.values())
        return {
            self.processor.id_to_piece(i): i
            for i in range(self.vocab_size)
            if self.processor.is_control(i) and i not in specials
        }

    def encode(self, lines: Sequence[str], *, num_threads: int = 1) -> list[list[int]]:
        """Piece ids without EOS. Threads are SentencePiece's own, so output is thread-count independent."""
        return self.processor.encode(list(lines), out_type=int, num_threads=num_threads)

    def encode_with_eos(
        self, lines: Sequence[str], *, dtype: np.dtype, num_threads: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """The stored form: ``(tokens, lengths)``, each sentence's ids followed by EOS, back to back.

        SentencePiece appends the EOS itself (``add_eos``), so the ids go from its lists into one
        array in a single C-level pass.
        """
        ids = self.processor.encode(
            list(lines), out_type=int, add_eos=True, num_threads=num_threads
        )
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(
            itertools.chain.from_iterable(ids), dtype=dtype, count=int(lengths.sum())
        )
        return tokens, lengths

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text from ids; special ids (pad/bos/eos) are dropped."""
        special = (PAD_ID, BOS_ID, EOS_ID)
        return self.processor.decode([[int(i) for i in seq if i not in special] for seq in ids])


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32: half the disk and page cache for usual vocabularies."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)

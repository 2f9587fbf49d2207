"""A foreign vocabulary (Marian's vocab.json, fairseq's dict.txt) over a SentencePiece model, turned into
a SentencePiece model of ours: the same segmentation, with ids in the foreign order and our special ids.

Marian and fairseq use SentencePiece only to cut text into pieces, then look each piece up in their own
vocabulary; their ids are not SentencePiece's, and their special ids are not ours (pad 0, bos 1, eos 2,
unk 3). nmt encodes with SentencePiece ids directly, so the import rewrites the model proto: our four
special pieces first, then every other foreign entry in foreign order. Each piece keeps its score and
type, so the segmentation is the original one; a foreign entry the model cannot produce (a piece of the
other language's model, fairseq's ``madeupword`` padding) is kept as an UNUSED piece so that every
embedding row has its id; a language token ``>>xx<<`` becomes USER_DEFINED, so SentencePiece emits it
whole as the Marian tokenizer does. A piece of the model that is missing from the foreign vocabulary
(the foreign toolkit reads it as unknown) is dropped: SentencePiece segments around it instead.

``ForeignVocab.ours_from_foreign`` maps each foreign id to ours: embedding rows and logits move with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nmt.data.spm import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SentencePieceModel

_LANGUAGE_TOKEN = re.compile(r">>[^<>\s]+<<")


def _proto_module():  # sentencepiece ships the protobuf module; imported when a vocabulary is converted
    from sentencepiece import sentencepiece_model_pb2

    return sentencepiece_model_pb2


@dataclass(frozen=True)
class ForeignVocab:
    proto: bytes  # our SentencePiece model
    ours_from_foreign: list[int]  # foreign id -> our id
    num_dropped: int  # pieces of the SentencePiece model the foreign vocabulary lacks


def convert_vocabulary(
    spm_proto: bytes,
    entries: Sequence[str],
    *,
    specials: dict[str, int],
    name: str,
    bos_piece: str = "<s>",
) -> ForeignVocab:
    """Our SentencePiece model for the foreign vocabulary ``entries`` (pieces by foreign id) over the
    SentencePiece model ``spm_proto``. ``specials`` gives the foreign ids of ``pad``, ``eos``, ``unk``
    and, when the foreign vocabulary has one, ``bos``; without it our BOS is a new piece ``bos_piece``.
    ``name`` names the files in errors. A vocabulary that shares less than half of its pieces with the
    SentencePiece model belongs to another model: ValueError."""
    pb = _proto_module()
    original = pb.ModelProto()
    try:
        original.ParseFromString(spm_proto)
    except Exception as error:  # protobuf's DecodeError, without importing protobuf here
        raise ValueError(f"{name}: not a SentencePiece model ({error})") from None
    if not original.pieces:
        raise ValueError(f"{name}: not a SentencePiece model (no pieces)")
    if len(set(entries)) != len(entries):
        duplicate = next(piece for piece in entries if entries.count(piece) > 1)
        raise ValueError(f"{name}: the vocabulary lists {duplicate!r} twice")
    for role, index in specials.items():
        if not 0 <= index < len(entries):
            raise ValueError(
                f"{name}: the {role} id {index} is outside the vocabulary's {len(entries)} entries"
            )
    known = {piece.piece: piece for piece in original.pieces}
    normal = [
        p.piece for p in original.pieces if p.type in (p.NORMAL, p.USER_DEFINED, p.BYTE)
    ]  # what segmentation can produce
    shared = sum(piece in set(entries) for piece in normal)
    if shared < len(normal) / 2:
        raise ValueError(
            f"{name}: the vocabulary and the SentencePiece model do not match (only {shared} of the "
            f"model's {len(normal)} pieces are in the vocabulary): files of different models?"
        )

    ours_of_special = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}
    special_pieces = {role: entries[index] for role, index in specials.items()}
    special_pieces.setdefault("bos", bos_piece)
    if "bos" not in specials and bos_piece in entries:
        raise ValueError(
            f"{name}: the vocabulary has a piece {bos_piece!r} that is not its decoder start: "
            "it cannot also be our BOS"
        )
    order = [special_pieces[role] for role in ("pad", "bos", "eos", "unk")]
    foreign_special_ids = set(specials.values())
    order += [piece for index, piece in enumerate(entries) if index not in foreign_special_ids]
    ours_of_piece = {piece: index for index, piece in enumerate(order)}
    ours_from_foreign = [ours_of_piece[piece] for piece in entries]
    for role, index in specials.items():
        ours_from_foreign[index] = ours_of_special[role]

    num_dropped = sum(piece not in ours_of_piece for piece in normal)
    spec = original.trainer_spec
    if [p.piece for p in original.pieces] == order and (
        spec.pad_id,
        spec.bos_id,
        spec.eos_id,
        spec.unk_id,
    ) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID):  # already ours (an nmt export): the very same model
        return ForeignVocab(spm_proto, ours_from_foreign, num_dropped)
    converted = pb.ModelProto()
    converted.CopyFrom(original)
    del converted.pieces[:]
    Piece = pb.ModelProto.SentencePiece
    for index, piece in enumerate(order):
        entry = converted.pieces.add()
        entry.piece = piece
        if index == UNK_ID:
            entry.type, entry.score = Piece.UNKNOWN, 0.0
        elif index < 4:
            entry.type, entry.score = Piece.CONTROL, 0.0
        elif piece in known and known[piece].type in (Piece.NORMAL, Piece.USER_DEFINED, Piece.BYTE):
            entry.type, entry.score = known[piece].type, known[piece].score
        elif _LANGUAGE_TOKEN.fullmatch(piece):
            entry.type, entry.score = Piece.USER_DEFINED, 0.0
        else:
            entry.type, entry.score = Piece.UNUSED, 0.0
    spec = converted.trainer_spec
    spec.pad_id, spec.bos_id, spec.eos_id, spec.unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID
    spec.pad_piece, spec.bos_piece, spec.eos_piece, spec.unk_piece = order[:4]
    spec.vocab_size = len(order)
    proto = converted.SerializeToString()
    SentencePieceModel(proto, name=name)  # our special ids, checked as for any model we load
    return ForeignVocab(proto=proto, ours_from_foreign=ours_from_foreign, num_dropped=num_dropped)

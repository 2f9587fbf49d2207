"""The binary dataset format: a token file and an index file per split and side.

``NAME.bin``: 32-byte header (magic ``NMTBIN\\0\\0``, version u32, dtype code u32, token count u64,
reserved u64), then the tokens back to back.
``NAME.idx``: 32-byte header (magic ``NMTIDX\\0\\0``, version u32, dtype code u32, sequence count
u64, reserved u64), then ``count + 1`` int64 offsets into the token array, then ``count`` int32
lengths, so batching can read every length without touching (or paging in) the tokens.
All integers little-endian. Both files are memory-mapped on reading.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

import numpy as np

FORMAT_VERSION = 1
HEADER_BYTES = 32
BIN_MAGIC = b"NMTBIN\x00\x00"
IDX_MAGIC = b"NMTIDX\x00\x00"
_HEADER = struct.Struct("<8sIIQQ")
DTYPE_CODES = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}


def _pack_header(magic: bytes, dtype: np.dtype, count: int) -> bytes:
    return _HEADER.pack(magic, FORMAT_VERSION, _CODE_OF[np.dtype(dtype).newbyteorder("<")], count, 0)


def _read_header(path: str, magic: bytes) -> tuple[np.dtype, int]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(HEADER_BYTES)
    except OSError as error:
        raise ValueError(f"{path}: cannot read: {error}") from None
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{path}: truncated header ({len(raw)} bytes)")
    found_magic, version, code, count, _ = _HEADER.unpack(raw)
    if found_magic != magic:
        raise ValueError(f"{path}: not an nmt {'token' if magic == BIN_MAGIC else 'index'} file (bad magic)")
    if version != FORMAT_VERSION:
        raise ValueError(f"{path}: format version {version}, this nmt reads version {FORMAT_VERSION}")
    if code not in DTYPE_CODES:
        raise ValueError(f"{path}: unknown token dtype code {code}")
    return DTYPE_CODES[code], count


def _fsync_close(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


class IndexedWriter:
    """Appends sequences to ``PREFIX.bin``/``PREFIX.idx``; headers carry the counts once finished."""

    def __init__(self, prefix: str, *, dtype: np.dtype) -> None:
        self.prefix = prefix
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype not in _CODE_OF:
            raise ValueError(f"unsupported token dtype {dtype}")
        self._bin = open(prefix + ".bin", "wb")
        self._bin.write(_pack_header(BIN_MAGIC, self.dtype, 0))
        self._lengths: list[np.ndarray] = []

    def add_many(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``len(lengths)`` sequences stored back to back in ``tokens``."""
        assert int(lengths.sum()) == tokens.shape[0], "lengths must cover tokens exactly"
        self._bin.write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
        self._lengths.append(np.asarray(lengths, dtype=np.int64))

    def finish(self) -> int:
        """Write the index, fix the token count in the header, fsync both; returns the token count."""
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, dtype=np.int64)
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise ValueError(f"{self.prefix}: a sequence longer than 2^31 tokens")
        offsets = np.zeros(lengths.shape[0] + 1, dtype="<i8")
        np.cumsum(lengths, out=offsets[1:])
        num_tokens = int(offsets[-1])
        self._bin.seek(0)
        self._bin.write(_pack_header(BIN_MAGIC, self.dtype, num_tokens))
        _fsync_close(self._bin)
        with open(self.prefix + ".idx", "wb") as idx:
            idx.write(_pack_header(IDX_MAGIC, self.dtype, lengths.shape[0]))
            idx.write(offsets.tobytes())
            idx.write(lengths.astype("<i4").tobytes())
            _fsync_close(idx)
        return num_tokens


class IndexedDataset:
    """Memory-mapped reader: ``ds[i]`` is sequence i (a read-only view), ``ds.lengths`` all lengths."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        bin_path, idx_path = prefix + ".bin", prefix + ".idx"
        self.dtype, num_tokens = _read_header(bin_path, BIN_MAGIC)
        idx_dtype, num_sequences = _read_header(idx_path, IDX_MAGIC)
        if idx_dtype != self.dtype:
            raise ValueError(f"{idx_path}: dtype {idx_dtype} differs from {bin_path}'s {self.dtype}")
        expected_bin = HEADER_BYTES + num_tokens * self.dtype.itemsize
        expected_idx = HEADER_BYTES + (num_sequences + 1) * 8 + num_sequences * 4
        for path, expected in ((bin_path, expected_bin), (idx_path, expected_idx)):
            size = os.path.getsize(path)
            if size != expected:
                raise ValueError(f"{path}: {size} bytes, header says {expected} (truncated or corrupt)")
        self.offsets = np.memmap(idx_path, dtype="<i8", mode="r", offset=HEADER_BYTES, shape=(num_sequences + 1,))
        self.lengths = np.memmap(
            idx_path, dtype="<i4", mode="r", offset=HEADER_BYTES + (num_sequences + 1) * 8, shape=(num_sequences,)
        )
        self.tokens = (
            np.memmap(bin_path, dtype=self.dtype, mode="r", offset=HEADER_BYTES, shape=(num_tokens,))
            if num_tokens
            else np.zeros(0, dtype=self.dtype)
        )
        if num_sequences and int(self.offsets[-1]) != num_tokens:
            raise ValueError(f"{idx_path}: offsets end at {int(self.offsets[-1])}, {bin_path} holds {num_tokens} tokens")

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def __getitem__(self, index: int) -> np.ndarray:
        start, end = self.offsets[index], self.offsets[index + 1]
        return self.tokens[start:end]

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]

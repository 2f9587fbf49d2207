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
import shutil
import struct
from typing import BinaryIO

import numpy as np

from nmt.data.manifest import SideEntry
from nmt.fileio import describe_os_error, open_for_writing, write_all

FORMAT_VERSION = 1
HEADER_BYTES = 32
BIN_MAGIC = b"NMTBIN\x00\x00"
IDX_MAGIC = b"NMTIDX\x00\x00"
_HEADER = struct.Struct("<8sIIQQ")
DTYPE_CODES = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
_CODE_OF = {dtype: code for code, dtype in DTYPE_CODES.items()}


def _pack_header(magic: bytes, dtype: np.dtype, count: int) -> bytes:
    return _HEADER.pack(
        magic, FORMAT_VERSION, _CODE_OF[np.dtype(dtype).newbyteorder("<")], count, 0
    )


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
        raise ValueError(
            f"{path}: not an nmt {'token' if magic == BIN_MAGIC else 'index'} file (bad magic)"
        )
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: format version {version}, this nmt reads version {FORMAT_VERSION}"
        )
    if code not in DTYPE_CODES:
        raise ValueError(f"{path}: unknown token dtype code {code}")
    return DTYPE_CODES[code], count


def _fsync_close(handle: BinaryIO) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


class IndexedWriter:
    """Appends sequences to ``PREFIX.bin``/``PREFIX.idx`` as they come; memory does not grow with them.

    Tokens go to the ``.bin`` and offsets to the ``.idx`` at once; lengths wait in a temporary file
    (they follow all offsets in the index) and are appended by ``finish``, which also writes the
    counts into both headers. A failed write names its file (``describe_os_error``: "disk full").
    """

    def __init__(self, prefix: str, *, dtype: np.dtype) -> None:
        self.prefix = prefix
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype not in _CODE_OF:
            raise ValueError(f"unsupported token dtype {dtype}")
        self.num_sequences = 0
        self.num_tokens = 0
        self.max_token_id = -1
        self._lengths_path = prefix + ".lengths.tmp"
        self._bin = open_for_writing(prefix + ".bin")
        self._idx = open_for_writing(prefix + ".idx")
        self._lengths = open_for_writing(self._lengths_path)
        write_all(self._bin, _pack_header(BIN_MAGIC, self.dtype, 0))
        write_all(
            self._idx, _pack_header(IDX_MAGIC, self.dtype, 0) + np.zeros(1, dtype="<i8").tobytes()
        )

    def add_many(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``len(lengths)`` sequences stored back to back in ``tokens``."""
        lengths = np.asarray(lengths, dtype=np.int64)
        assert int(lengths.sum()) == tokens.shape[0], "lengths must cover tokens exactly"
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise ValueError(f"{self.prefix}: a sequence longer than 2^31 tokens")
        if tokens.size:
            self.max_token_id = max(self.max_token_id, int(tokens.max()))
        offsets = self.num_tokens + np.cumsum(lengths)
        write_all(self._bin, np.ascontiguousarray(tokens, dtype=self.dtype).data)
        write_all(self._idx, offsets.astype("<i8").data)
        write_all(self._lengths, lengths.astype("<i4").data)
        self.num_tokens += int(tokens.shape[0])
        self.num_sequences += int(lengths.shape[0])

    def finish_entry(self, prefix: str) -> SideEntry:
        """``finish``, then the manifest's entry of this file pair, named by ``prefix``."""
        self.finish()
        return SideEntry(
            prefix=prefix,
            num_tokens=self.num_tokens,
            token_dtype=str(self.dtype),
            max_token_id=self.max_token_id,
        )

    def finish(self) -> int:
        """Append the lengths to the index, write both headers, fsync; returns the token count."""
        try:
            _fsync_close(self._lengths)
            with open(self._lengths_path, "rb") as lengths:
                shutil.copyfileobj(lengths, self._idx, 1 << 20)
            os.remove(self._lengths_path)
            for handle, magic, count in (
                (self._bin, BIN_MAGIC, self.num_tokens),
                (self._idx, IDX_MAGIC, self.num_sequences),
            ):
                handle.seek(0)
                handle.write(_pack_header(magic, self.dtype, count))
                _fsync_close(handle)
        except OSError as error:
            raise describe_os_error(error, error.filename or self.prefix + ".idx") from None
        return self.num_tokens


class IndexedDataset:
    """Memory-mapped reader: ``ds[i]`` is sequence i (a read-only view), ``ds.lengths`` all lengths."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        bin_path, idx_path = prefix + ".bin", prefix + ".idx"
        self.dtype, num_tokens = _read_header(bin_path, BIN_MAGIC)
        idx_dtype, num_sequences = _read_header(idx_path, IDX_MAGIC)
        if idx_dtype != self.dtype:
            raise ValueError(
                f"{idx_path}: dtype {idx_dtype} differs from {bin_path}'s {self.dtype}"
            )
        expected_bin = HEADER_BYTES + num_tokens * self.dtype.itemsize
        expected_idx = HEADER_BYTES + (num_sequences + 1) * 8 + num_sequences * 4
        for path, expected in ((bin_path, expected_bin), (idx_path, expected_idx)):
            size = os.path.getsize(path)
            if size != expected:
                raise ValueError(
                    f"{path}: {size} bytes, header says {expected} (truncated or corrupt)"
                )
        self.offsets = np.memmap(
            idx_path, dtype="<i8", mode="r", offset=HEADER_BYTES, shape=(num_sequences + 1,)
        )
        self.lengths = np.memmap(
            idx_path,
            dtype="<i4",
            mode="r",
            offset=HEADER_BYTES + (num_sequences + 1) * 8,
            shape=(num_sequences,),
        )
        self.tokens = (
            np.memmap(
                bin_path, dtype=self.dtype, mode="r", offset=HEADER_BYTES, shape=(num_tokens,)
            )
            if num_tokens
            else np.zeros(0, dtype=self.dtype)
        )
        # Plain array views of the maps, which they keep open: np.memmap's Python-level __getitem__
        # made reading one sample ~10 us, 80% of collating a batch (issue 47).
        self.offsets, self.tokens = self.offsets.view(np.ndarray), self.tokens.view(np.ndarray)
        if num_sequences and int(self.offsets[-1]) != num_tokens:
            raise ValueError(
                f"{idx_path}: offsets end at {int(self.offsets[-1])}, {bin_path} holds {num_tokens} tokens"
            )

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def __getitem__(self, index: int) -> np.ndarray:
        start, end = self.offsets[index], self.offsets[index + 1]
        return self.tokens[start:end]

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[0]


def scan_token_ids(
    dataset: IndexedDataset, *, limit: int, block_tokens: int = 1 << 24
) -> tuple[int, int]:
    """(largest id or -1 when empty, position of the first id >= ``limit`` or -1), in one pass.

    Read in blocks with ``readinto``, not through the memory map: a map touched end to end would
    count the whole file in this process's resident memory; a reused buffer keeps it at one block.
    """
    buffer = np.empty(min(block_tokens, max(dataset.num_tokens, 1)), dtype=dataset.dtype)
    largest, first_over, position = -1, -1, 0
    with open(dataset.prefix + ".bin", "rb") as handle:
        handle.seek(HEADER_BYTES)
        while count := handle.readinto(buffer.data) // dataset.dtype.itemsize:
            block = buffer[:count]
            block_max = int(block.max())
            if block_max >= limit and first_over < 0:
                first_over = position + int(np.argmax(block >= limit))
            largest = max(largest, block_max)
            position += count
    return largest, first_over

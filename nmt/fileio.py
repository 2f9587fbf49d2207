"""Writing files so that a reader never sees half of one, and naming the path when writing fails.

Every file the toolkit writes for later runs (checkpoints, manifests, blend caches, hypotheses)
goes through ``atomic_write``: a temporary sibling, flushed and fsynced, renamed over the target,
then the directory fsynced so the rename itself survives a power cut. A kill or a full disk at any
moment leaves either the old file or the new one, never a torn one, and no temporary behind
(except after kill -9, which ``remove_stale_temporaries`` sweeps up at the next start, under the
directory's lock).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator
from typing import IO, Any

TEMPORARY_MARK = ".tmp-"  # f".{name}.tmp-{pid}": hidden, and names the process that wrote it
_TEMPORARY = re.compile(r"^\..+\.tmp-(\d+)(?:-\d+)?$")


def temporary_sibling(path: str, *, tag: str = "") -> str:
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}{TEMPORARY_MARK}{os.getpid()}{tag}")


def fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(
    path: str, mode: str = "wb", *, tag: str = "", **open_kwargs: Any
) -> Iterator[IO[Any]]:
    """``with atomic_write(path) as handle: ...``: ``path`` appears complete, or not at all.

    ``tag`` distinguishes temporaries of several writers in one process (threads).
    """
    tmp_path = temporary_sibling(path, tag=tag)
    try:
        with open(tmp_path, mode, **open_kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp_path)
        if isinstance(error, OSError):
            raise describe_os_error(error, path) from None
        raise
    fsync_directory(os.path.dirname(os.path.abspath(path)))


class DescribedOSError(OSError):
    """An OSError whose message names the path and the cause in words; ``str()`` is that message alone."""

    def __str__(self) -> str:
        return str(self.strerror)


def open_for_writing(path: str) -> IO[bytes]:
    """``open(path, "wb")`` whose failure names the path (``describe_os_error``)."""
    try:
        return open(path, "wb")
    except OSError as error:
        raise describe_os_error(error, path) from None


def write_all(handle: IO[bytes], data: Any) -> None:
    """``handle.write(data)`` whose failure (a full disk...) names the file being written."""
    try:
        handle.write(data)
    except OSError as error:
        raise describe_os_error(error, handle.name) from None


def describe_os_error(error: OSError, path: str | None = None) -> OSError:
    """The same error with a message a user can act on: the path, and "disk full" for ENOSPC/EDQUOT.

    Describing a described error again returns it unchanged (the innermost path is the precise one).
    """
    if isinstance(error, DescribedOSError):
        return error
    where = path or error.filename or "?"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        message = f"{where}: disk full (no space left on the device while writing)"
    elif error.errno == errno.EFBIG:
        message = f"{where}: file too large for this file system or process limit"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        message = f"{where}: cannot write here ({os.strerror(error.errno)})"
    else:
        message = f"{where}: {error.strerror or error}"
    described = DescribedOSError(error.errno, message)
    described.filename = where
    return described


def remove_stale_temporaries(directory: str) -> list[str]:
    """Delete the temporaries (``.NAME.tmp-PID``) left in ``directory`` by writers that were killed.

    Call it holding the directory's lock (``exclusive_lock``): then no writer of this directory is
    alive, on this machine or another one sharing the file system, so every temporary is stale (a
    PID says nothing about a process of another machine).
    """
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(directory)):
            if _TEMPORARY.match(name):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(directory, name))
                    removed.append(name)
    return removed


def check_destination(destination: str, *, replace: bool, option: str, replace_flag: str) -> None:
    """ValueError unless ``destination`` is absent, empty, or may be replaced (``replace``)."""
    if os.path.exists(destination) and not os.path.isdir(destination):
        raise ValueError(f"{destination}: exists and is not a directory ({option})")
    if os.path.isdir(destination) and os.listdir(destination) and not replace:
        raise ValueError(
            f"{destination}: exists and is not empty; pass {replace_flag} to replace it ({option})"
        )


def install_directory(
    workdir: str, destination: str, *, replace: bool, option: str, replace_flag: str
) -> None:
    """Move a finished directory into place; an old one (``replace``) goes only after that. The
    destination is checked again here: a lock keeps other nmt runs out, not other programs."""
    import shutil

    check_destination(destination, replace=replace, option=option, replace_flag=replace_flag)
    previous = None
    if os.path.isdir(destination):
        previous = workdir + ".old"
        os.rename(destination, previous)
    os.rename(workdir, destination)
    if previous:
        shutil.rmtree(previous, ignore_errors=True)


def lock_path_beside(directory: str) -> str:
    """The lock file of a directory that gets replaced whole (a dataset): a hidden sibling."""
    parent, name = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{name}.lock")


@contextlib.contextmanager
def exclusive_lock(
    lock_path: str, *, what: str, shared: bool = False, wait: bool = False
) -> Iterator[None]:
    """Hold ``fcntl.flock`` on ``lock_path`` for the ``with`` block; the file records the holder's PID.

    The kernel drops the lock when its process dies, so a crashed run never leaves it stuck. Taken
    already: ValueError naming ``what`` (the directory) and the holder's PID, unless ``wait``.
    ``shared``: many holders, no exclusive one (the parts of one sharded dataset share its directory).
    The last holder removes the file; a locker that finds its file replaced meanwhile starts over.
    """
    fd = _acquire(lock_path, what=what, shared=shared, wait=wait)
    try:
        if not shared:
            os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):  # the last holder (exclusive now) takes the file away
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.remove(lock_path)
        os.close(fd)  # closing the descriptor releases the lock


def _acquire(lock_path: str, *, what: str, shared: bool, wait: bool) -> int:
    while True:
        try:
            # --destdir runs/new/data: its parent may not exist yet (fairseq creates it too).
            os.makedirs(os.path.dirname(lock_path) or ".", exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise describe_os_error(error, what) from None
        try:
            fcntl.flock(
                fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
            )
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").split() or ["unknown"]
            os.close(fd)
            raise ValueError(
                f"{what}: in use by another run (PID {holder[0]}); wait for it to finish or choose another directory"
            ) from None
        try:
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # locked a file its last holder had just removed: lock the new one

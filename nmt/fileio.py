"""Writing files so that a reader never sees half of one, and naming the path when writing fails.

Every file the toolkit writes for later runs (checkpoints, manifests, blend caches, hypotheses)
goes through ``atomic_write``: a temporary sibling, flushed and fsynced, renamed over the target,
then the directory fsynced so the rename itself survives a power cut. A kill or a full disk at any
moment leaves either the old file or the new one, never a torn one, and no temporary behind
(except after kill -9, which ``remove_stale_temporaries`` sweeps up at the next start).
"""

from __future__ import annotations

import contextlib
import errno
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
def atomic_write(path: str, mode: str = "wb", *, tag: str = "", **open_kwargs: Any) -> Iterator[IO[Any]]:
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


class FileError(OSError):
    """An OSError whose text is the whole message (the path and the cause), without "[Errno N]"."""

    def __str__(self) -> str:
        return str(self.strerror)


def describe_os_error(error: OSError, path: str | None = None) -> OSError:
    """The same error with a message a user can act on: the path, and "disk full" for ENOSPC/EDQUOT."""
    if isinstance(error, FileError):
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
    return FileError(error.errno, message)


def remove_stale_temporaries(directory: str) -> list[str]:
    """Delete temporaries (``.NAME.tmp-PID``) in ``directory`` whose writer process is gone."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            match = _TEMPORARY.match(name)
            if match and not _process_alive(int(match.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(directory, name))
                    removed.append(name)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DirectoryLock:
    """An exclusive lock on a directory for one run at a time (``fcntl.flock`` on a lock file inside).

    The kernel drops the lock when the holder exits, however it exits, so a crashed run never
    leaves a directory stuck; the file keeps the holder's PID, host and start time for the message
    the next run gets.
    """

    NAME = ".nmt.lock"

    def __init__(self, directory: str, *, purpose: str) -> None:
        self.directory = directory
        self.purpose = purpose
        self.path = os.path.join(directory, self.NAME)
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        """ValueError naming the directory and the holder when another process has it."""
        import fcntl
        import socket
        import time

        os.makedirs(self.directory, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ValueError(
                f"{self.directory}: in use by another {self.purpose} ({holder}); "
                "wait for it to finish or use another directory"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file drops the lock
            self._handle = None

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

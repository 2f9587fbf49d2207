"""Writing files so that a reader never sees half of one, and naming the path when writing fails.

Every file the toolkit writes for later runs (checkpoints, manifests, blend caches, hypotheses)
goes through ``atomic_write``: a temporary sibling, flushed and fsynced, renamed over the target,
then the directory fsynced so the rename itself survives a power cut. A kill or a full disk at any
moment leaves either the old file or the new one, never a torn one, and no temporary behind
(except after kill -9, which ``remove_stale_temporaries`` sweeps up at the next start, under the
directory's lock).

What a user names as an output never destroys what the command reads or what nmt keeps: every
command passes all its path options through ``check_written_paths`` (the one guard: outputs against
inputs by inode, against the datasets, exports and save dirs nmt manages, and against each other);
``write_output`` streams to a FIFO, a terminal or stdout instead of replacing it;
``Destination``/``install_directory`` replace a directory only when the same command made it
(``MADE_BY``) and it holds nothing else nmt keeps.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
import re
import stat
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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


@contextlib.contextmanager
def write_output(path: str, mode: str = "w", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """``with write_output(path) as handle: ...`` for a file a user names as a command's output.

    A regular file, or a symbolic link to one, is written atomically (``atomic_write``) at its real
    path, so that a link stays a link. This process's own stdout (``/dev/stdout``, whatever it is),
    a FIFO or a character device (a terminal, ``/dev/null``) is streamed to, never replaced by a
    regular file; anything else that exists there (a directory, a block device, a socket) is
    refused in one line.
    """
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as error:
        raise describe_os_error(error, path) from None
    if st is not None and _is_stdout(st):
        stream = sys.stdout.buffer if "b" in mode else sys.stdout
        yield stream
        stream.flush()
        return
    if st is not None and (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        try:
            with open(path, mode, **open_kwargs) as handle:
                yield handle
        except OSError as error:  # /dev/full, a FIFO whose reader went away...
            raise describe_os_error(error, error.filename or path) from None
        return
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = (
            "a directory" if stat.S_ISDIR(st.st_mode) else "neither a file, a FIFO nor a terminal"
        )
        raise ValueError(f"{path}: {kind}; name a file to write")
    real = os.path.realpath(path)
    try:
        os.makedirs(os.path.dirname(real), exist_ok=True)
    except OSError as error:
        raise describe_os_error(error, path) from None
    with atomic_write(real, mode, **open_kwargs) as handle:
        yield handle


def _is_stdout(st: os.stat_result) -> bool:
    try:
        stdout = os.fstat(1)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (stdout.st_dev, stdout.st_ino)


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


def _identities(path: str) -> tuple[tuple[int, int] | None, set[tuple[int, int]]]:
    """(device, inode) of ``path`` (None when it does not exist), and those of every existing
    directory above it, the path's symbolic links resolved: the same file under any spelling."""
    try:
        st = os.stat(path)
        own: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except OSError:
        own = None
    above = set()
    current = os.path.realpath(path)
    while (parent := os.path.dirname(current)) != current:
        current = parent
        with contextlib.suppress(OSError):
            st = os.stat(current)
            above.add((st.st_dev, st.st_ino))
    return own, above


def check_apart(outputs: Sequence[tuple[str, str]], inputs: Sequence[tuple[str, str]]) -> None:
    """ValueError (one line) when an output is, holds, or lies inside one of the command's inputs,
    which writing it would destroy. Both are ``(option, path)``; files are compared by inode, so
    a symbolic link, a hard link or ``./a/../a`` are the file they name. Missing inputs are left
    to the command's own error."""
    for out_option, out_path in outputs:
        out_own, out_above = _identities(out_path)
        for in_option, in_path in inputs:
            in_own, in_above = _identities(in_path)
            if in_own is None:
                continue
            if out_own == in_own:
                relation = "is"
            elif out_own is not None and out_own in in_above:
                relation = "holds"
            elif in_own in out_above:
                relation = "lies inside"
            else:
                continue
            raise ValueError(
                f"{out_option} {out_path}: {relation} {in_option} {in_path}, an input of this "
                f"command that writing it would destroy; choose another {out_option}"
            )


MADE_BY = ".nmt-made-by"  # the marker of a directory a command installed: its name, one line


@dataclass(frozen=True)
class Destination:
    """A directory a command builds aside and installs whole (``nmt-preprocess --destdir``,
    ``nmt-export --output-dir``). ``replace`` (the command's ``replace_flag``) lets it replace
    only a directory the same command made before (``MADE_BY`` names it), never another one;
    and never one that is, holds or lies inside an input."""

    path: str
    option: str  # "--output-dir"
    replace_flag: str  # "--force"
    made_by: str  # "nmt-export": written into the marker, and required of a directory to replace
    replace: bool = False
    inputs: Sequence[tuple[str, str]] = ()  # (option, path) of what the command reads


def made_by(directory: str) -> str | None:
    """The command that installed ``directory`` (its ``MADE_BY`` marker), or None."""
    try:
        with open(os.path.join(directory, MADE_BY), encoding="utf-8") as handle:
            return handle.readline(200).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def mark_directory(directory: str, command: str) -> None:
    """Record that ``command`` made ``directory`` and what it put there (the names at its top):
    its ``replace_flag`` may replace it later, with those and nothing else that nmt keeps."""
    names = sorted(name for name in os.listdir(directory) if name != MADE_BY)
    with atomic_write(os.path.join(directory, MADE_BY), "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in (command, *names)))


def _made_entries(directory: str) -> set[str] | None:
    """The names the marker says its command put at the top of ``directory``; None for a marker
    from before they were recorded."""
    try:
        with open(os.path.join(directory, MADE_BY), encoding="utf-8") as handle:
            lines = handle.read().split("\n")
    except (OSError, UnicodeDecodeError):
        return None
    return {line for line in lines[1:] if line} if len(lines) > 2 else None


def _foreign(item: tuple[str, str], destination: Destination) -> bool:
    """Whether something nmt keeps, found inside a directory about to be replaced, is not the
    replacing command's own: not a part the same command made (a sharded dataset's), and not
    among the names its marker lists (without a list: any save dir, dataset or export below)."""
    kind, path = item
    if made_by(path) == destination.made_by:
        return False
    entries = _made_entries(destination.path)
    if entries is None:
        return kind != "checkpoint"
    top = os.path.relpath(path, destination.path).split(os.sep)[0]
    return top not in entries


def check_destination(destination: Destination) -> None:
    """ValueError (one line) unless the destination is absent or empty, or may be replaced: the
    replace flag was given and the command made it; and never when it overlaps an input."""
    path, option, flag = destination.path, destination.option, destination.replace_flag
    check_apart([(option, path)], destination.inputs)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise ValueError(f"{path}: exists and is not a directory ({option})")
    if not os.path.isdir(path) or not os.listdir(path):
        return
    if not destination.replace:
        raise ValueError(f"{path}: exists and is not empty; pass {flag} to replace it ({option})")
    if made_by(path) != destination.made_by:
        raise ValueError(
            f"{path}: not a directory {destination.made_by} made (no {MADE_BY} naming it), so "
            f"{flag} does not replace it; remove it yourself or choose another {option}"
        )
    kept = next((item for item in _kept_below(path) if _foreign(item, destination)), None)
    if kept is not None:
        raise ValueError(
            f"{path}: holds {_describe(*kept)}, which {flag} would delete with it; move it out "
            f"or choose another {option}"
        )


def install_directory(workdir: str, destination: Destination) -> None:
    """Mark a finished directory as the command's and move it into place; an old one (``replace``)
    goes only after that. The destination is checked again here: a lock keeps other nmt runs out,
    not other programs."""
    import shutil

    mark_directory(workdir, destination.made_by)
    check_destination(destination)
    if not os.path.isdir(destination.path):
        os.rename(workdir, destination.path)
        return
    if _exchange(workdir, destination.path):  # workdir now holds the old directory
        shutil.rmtree(workdir, ignore_errors=True)
        return
    # Without an atomic exchange a kill between the two renames leaves the old directory aside
    # under a name the next run's clean-up of killed work directories would remove.
    previous = workdir + ".old"
    os.rename(destination.path, previous)
    os.rename(workdir, destination.path)
    shutil.rmtree(previous, ignore_errors=True)


def _exchange(first: str, second: str) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``): a kill at any moment
    leaves either both as they were or both swapped. False where the kernel, the C library or
    the file system cannot."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, rename_exchange = -100, 2
    result = renameat2(at_cwd, os.fsencode(first), at_cwd, os.fsencode(second), rename_exchange)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise describe_os_error(OSError(error, os.strerror(error)), second)


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


# ------------------------------------------------------------------------------- the output guard
READ = "read"  # a file or directory the command reads
PREFIX = "prefix"  # read as PREFIX.SUFFIX files (nmt-preprocess's --trainpref)
# What a command writes at a path: a file, a directory of files (TensorBoard, --results-path), or
# one of the directories nmt manages.
FILE, DIRECTORY, SAVE_DIR, DATASET, EXPORT = "file", "dir", "save_dir", "dataset", "export"
PATH_KINDS = (READ, PREFIX, FILE, DIRECTORY, SAVE_DIR, DATASET, EXPORT)
# Replaced whole by --overwrite/--force and checksummed: nothing else may be written inside them.
REPLACED_WHOLE = (DATASET, EXPORT)
_MAKERS = {
    "nmt-preprocess": DATASET,
    "nmt-eval --output-dataset": DATASET,
    "nmt-filter": DATASET,
    "nmt-export": EXPORT,
    "nmt-import": EXPORT,
}
# A dataset from before the markers has its manifest; a save dir is known by its checkpoints.
_DATASET_FILE = "manifest.json"
_SAVE_DIR_FILES = ("checkpoint_last.pt", "checkpoint_best.pt")
_CHECKPOINT_SUFFIXES = (".pt", ".pth")
_SCAN_DEPTH, _SCAN_ENTRIES = 2, 5000  # how far below an output directory kept things are looked for


@dataclass(frozen=True)
class PathOption:
    """A path a command was given: its option (``--log-file``, or ``DATA_DIR`` for a positional),
    the path, and what the command does there (``PATH_KINDS``)."""

    option: str
    path: str
    kind: str


def managed_kind(directory: str) -> str | None:
    """What nmt keeps in ``directory``: DATASET or EXPORT (replaced whole by the command that made
    them), SAVE_DIR (a run's checkpoints), or None."""
    maker = made_by(directory)
    if maker in _MAKERS:
        return _MAKERS[maker]
    if _is_dataset_manifest(os.path.join(directory, _DATASET_FILE)):
        return DATASET
    if any(os.path.isfile(os.path.join(directory, name)) for name in _SAVE_DIR_FILES):
        return SAVE_DIR
    return None


def _is_dataset_manifest(path: str) -> bool:
    """nmt-preprocess's manifest.json, not any file of that name (a web project's, above a run)."""
    try:
        with open(path, "rb") as handle:
            return b'"manifest_version"' in handle.read(256)
    except OSError:
        return False


def _describe(kind: str, path: str) -> str:
    what = {
        DATASET: "a dataset",
        EXPORT: "an exported model",
        SAVE_DIR: "a save dir with checkpoints",
        "checkpoint": "a checkpoint",
    }[kind]
    return f"{path}, {what}"


def _is_checkpoint(path: str) -> bool:
    """A PyTorch checkpoint (zip or pickle) by its name and first bytes."""
    if not path.endswith(_CHECKPOINT_SUFFIXES) or not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return False
    return head == b"PK\x03\x04" or head[:1] == b"\x80"


def _kept_below(directory: str) -> Iterator[tuple[str, str]]:
    """(kind, path) of what nmt keeps below ``directory`` (datasets, exports, save dirs,
    checkpoints), down to a few levels and a few thousand entries: a bound, not a full walk."""
    level = [directory]
    seen = 0
    for _ in range(_SCAN_DEPTH):
        below = []
        for parent in level:
            try:
                entries = list(itertools.islice(os.scandir(parent), _SCAN_ENTRIES - seen))
            except OSError:
                continue
            seen += len(entries)
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    kind = managed_kind(entry.path)
                    if kind is not None:
                        yield kind, entry.path
                    else:
                        below.append(entry.path)
                elif _is_checkpoint(entry.path):
                    yield "checkpoint", entry.path
            if seen >= _SCAN_ENTRIES:
                return
        level = below


def _input_candidates(option: PathOption) -> list[tuple[str, str]]:
    """The files an input option names: the path itself, a ``kind:PATH`` value's path (``--curriculum
    model:CKPT``), and for a prefix every ``PREFIX.*`` file."""
    path = option.path
    paths = [path]
    if re.match(r"^[a-z]+:", path) and not os.path.exists(path):
        paths.append(path.split(":", 1)[1])
    if option.kind == PREFIX:
        directory, stem = os.path.split(path)
        with contextlib.suppress(OSError):
            paths += [
                os.path.join(directory, name)
                for name in os.listdir(directory or ".")
                if name.startswith(stem + ".")
            ]
    return [(option.option, candidate) for candidate in paths]


def _is_stream(path: str) -> bool:
    """stdout, a FIFO, a terminal, /dev/null: written to, never replaced (``write_output``)."""
    if path == "-":
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def check_written_paths(paths: Sequence[PathOption]) -> None:
    """The one guard every command passes its path options through, before it writes anything.

    ValueError (one line naming the option) when an output is, holds or lies inside an input
    (``check_apart``: by inode, whatever the spelling); lies inside a dataset or an export, which
    their commands replace whole and checksum; is a directory nmt manages of another kind than the
    command writes there (a save dir that is a dataset, a dataset over a save dir); replaces a
    checkpoint; is a save dir or log directory holding a dataset or an export; or is also another
    output of the same command.
    """
    inputs = [
        candidate for p in paths if p.kind in (READ, PREFIX) for candidate in _input_candidates(p)
    ]
    outputs = [p for p in paths if p.kind not in (READ, PREFIX) and not _is_stream(p.path)]
    for output in outputs:
        check_apart([(output.option, output.path)], inputs)
        _check_place(output)
    for first, second in itertools.combinations(outputs, 2):
        into_one_directory = {first.kind, second.kind} <= {DIRECTORY, SAVE_DIR}
        if not into_one_directory and _same_path(first.path, second.path):
            raise ValueError(
                f"{second.option} {second.path}: also given to {first.option}; each output "
                "needs a place of its own"
            )


def _same_path(first: str, second: str) -> bool:
    """The same file or directory, existing or still to be made, however it is spelled."""
    if os.path.realpath(first) == os.path.realpath(second):
        return True
    own_first, own_second = _identities(first)[0], _identities(second)[0]
    return own_first is not None and own_first == own_second


def _check_place(output: PathOption) -> None:
    real = os.path.realpath(output.path)
    refuse = f"{output.option} {output.path}:"
    kind = managed_kind(real) if os.path.isdir(real) else None
    # Logs and TensorBoard files may go beside the checkpoints they describe.
    beside_checkpoints = kind == SAVE_DIR and output.kind in (FILE, DIRECTORY)
    if kind is not None and kind != output.kind and not beside_checkpoints:
        raise ValueError(f"{refuse} is {_describe(kind, real)}; choose another {output.option}")
    current = real
    while (parent := os.path.dirname(current)) != current:
        current = parent
        above = managed_kind(current)
        if above in REPLACED_WHOLE:
            raise ValueError(
                f"{refuse} lies inside {_describe(above, current)}, which is replaced whole and "
                f"checksummed; choose a path outside it for {output.option}"
            )
    if output.kind == FILE and _is_checkpoint(real):
        raise ValueError(
            f"{refuse} is {_describe('checkpoint', real)}; choose another {output.option}"
        )
    if output.kind in (SAVE_DIR, DIRECTORY) and os.path.isdir(real):
        held = next((k for k in _kept_below(real) if k[0] in REPLACED_WHOLE), None)
        if held is not None:
            raise ValueError(
                f"{refuse} holds {_describe(*held)}; a {output.kind.replace('_', ' ')} and a "
                f"dataset or export do not share a directory: choose another {output.option}"
            )

"""Child processes that end with their parent, and a parent that stops cleanly on SIGTERM or Ctrl+C.

A forked worker blocks on its pool's pipe, whose write end it inherited: when the parent dies it
would wait forever. ``die_with_parent`` (the pool's initializer) asks the kernel to kill it then
(Linux's parent-death signal), or watches its parent where that is unavailable. Workers ignore
SIGINT: Ctrl+C reaches the whole process group, and the parent alone decides how to stop.
``run_in_child`` runs one long call into C (SentencePiece training) in such a child, so that the
parent, waiting on a pipe, acts on a signal at once.

``stop_on_signals`` turns SIGTERM into ``Terminated`` (a ``KeyboardInterrupt``, as Ctrl+C is): the
same ``finally`` blocks run, which close the pool and remove half-written output, and no
``except Exception`` swallows it. ``signals_deferred`` holds both signals back over a step that
must not stop halfway (installing a finished directory over an old one).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import TypeVar

_T = TypeVar("_T")
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_POLL_SECONDS = 0.5
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM received; ``signum`` gives the conventional exit status 128 + 15."""

    signum = signal.SIGTERM

    def __str__(self) -> str:
        return "terminated (SIGTERM)"


def interruption(signum: int) -> KeyboardInterrupt:
    """What a stop signal raises: ``Terminated`` for SIGTERM, ``KeyboardInterrupt`` for SIGINT."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


# Stop signals a command acted on by finishing its work early and returning normally (nmt-train
# saves and exits 0): a caller running the command in this process (nmt.recipe) must not take
# the early end for a finished step.
_signals_acted_on: list[int] = []


def note_stop_signal(signum: int) -> None:
    """``signum`` ended a command's work early, although it returns normally."""
    _signals_acted_on.append(signum)


def stop_signals_noted() -> int:
    """How many stop signals commands of this process acted on (``note_stop_signal``) so far."""
    return len(_signals_acted_on)


def last_stop_signal() -> int:
    """The last noted stop signal (SIGINT when none was noted)."""
    return _signals_acted_on[-1] if _signals_acted_on else signal.SIGINT


def die_with_parent(parent_pid: int) -> None:
    """Worker initializer: end this process when ``parent_pid`` ends, leave Ctrl+C to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Forked workers inherit the parent's handlers: a SIGTERM sent to a worker must end it, not
    # become an exception that the pool sends back to the parent as a task's result.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not _set_parent_death_signal():
        threading.Thread(
            target=_watch_parent, args=(parent_pid,), name="watch-parent", daemon=True
        ).start()
    # The parent may have died before the kernel knew to tell us (we are then someone else's child).
    if os.getppid() != parent_pid:
        os._exit(1)


def _set_parent_death_signal() -> bool:
    """SIGKILL this process when its parent (the thread that forked it) ends; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(_PARENT_POLL_SECONDS)
    os._exit(1)


class _StopState:
    """What ``stop_on_signals`` received, and whether a deferring block is open."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.raised = False
        self.deferring = 0

    def handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            return  # already stopping: the cleanup under way is short, let it finish
        self.received = signum
        if not self.deferring:
            self.raised = True
            raise interruption(signum)


_state: _StopState | None = None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` and SIGTERM ``Terminated`` once; later ones are ignored
    while the block unwinds. Off the main thread (where Python cannot handle signals) a no-op.

    An exception that the signal caused indirectly (a worker killed by the same group's signal)
    is reported as the signal."""
    global _state
    if threading.current_thread() is not threading.main_thread() or _state is not None:
        yield
        return
    state = _StopState()
    previous = {signum: signal.signal(signum, state.handle) for signum in _STOP_SIGNALS}
    _state = state
    try:
        yield
    except Exception:
        if state.received is None:
            raise
        raise interruption(state.received) from None
    finally:
        _state = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """A signal that arrives in the block stops the run only after it (under ``stop_on_signals``)."""
    state = _state
    if state is None:
        yield
        return
    state.deferring += 1
    try:
        yield
    finally:
        state.deferring -= 1
    if not state.deferring and state.received is not None and not state.raised:
        state.raised = True
        raise interruption(state.received)


def run_in_child(function: Callable[[], _T], *, what: str) -> _T:
    """``function()`` in a forked child process that dies with this one; its result or exception
    comes back pickled. Interrupted, this process kills the child. Not a thread: one left in C++
    code that calls back into Python while the interpreter shuts down ends in ``std::terminate``
    (seen with SentencePiece). A crash in C ends the child only: ChildProcessError (an OSError)
    naming ``what``."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_child_main, args=(function, sender, os.getpid()), name=what, daemon=True
    )
    child.start()
    sender.close()  # the child holds the write end: its death is our EOF
    try:
        succeeded, value = receiver.recv()
    except EOFError:
        child.join()
        raise ChildProcessError(
            errno.ECHILD,
            f"its process died (exit status {child.exitcode}: killed, or out of memory)",
            what,
        ) from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receiver.close()
    if not succeeded:
        raise value
    return value


def _child_main(function: Callable[[], object], sender: Connection, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    try:
        result: tuple[bool, object] = (True, function())
    except Exception as error:  # handed to the parent, which raises it
        result = (False, error)
    try:
        sender.send(result)
    except Exception as error:  # an exception that does not pickle: its text
        sender.send((False, RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({error})")))

"""How a command stops early: Ctrl-C, SIGTERM, and a pipe whose reader left.

- Ctrl-C: the command says it was interrupted and exits 130; ``encode`` removes its staging
  directory next to ``--out`` and its temporary files, ``--out`` stays as it was.
- SIGTERM (``kill``, ``timeout``, a scheduler preempting the job) is raised as `Terminated`,
  a ``KeyboardInterrupt``, so the same cleanup runs; exit 143 (128 + 15). Python's default
  action ended the process on the spot and left the staging directory (a partial copy of
  the dataset) and the temporary Arrow files behind.
- ``mmpipe ... | head``: once the reader has left, the rest of the output goes to
  /dev/null and the command ends with its own exit status, without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator, Optional

INTERRUPTED_STATUS = 130
TERMINATED_STATUS = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be (`sigterm_interrupts`)."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside: SIGTERM raises `Terminated` in this process. A forked child (``datasets.map``
    workers, DataLoader workers) inherits the handler but ends as before: a pool stops its
    workers with SIGTERM, and they must not print a traceback each. Outside the main thread
    (no signal handlers there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pid = os.getpid()

    def on_sigterm(signum, frame):
        if os.getpid() != pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def interruption(error: Optional[BaseException]) -> Optional[KeyboardInterrupt]:
    """The Ctrl-C or SIGTERM behind ``error`` (itself, or an error raised while handling it:
    ``datasets.map(num_proc=...)``'s pool raises a TimeoutError from its cleanup), or None."""
    while error is not None:
        if isinstance(error, KeyboardInterrupt):
            return error
        error = error.__context__
    return None


def stopped(command: str, stop: KeyboardInterrupt, left: str = "") -> int:
    """Say on stderr that ``command`` was stopped (and what was ``left``); its exit status."""
    what = "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"
    print(f"\nmmpipe {command}: {what}{left}", file=sys.stderr)
    return TERMINATED_STATUS if isinstance(stop, Terminated) else INTERRUPTED_STATUS


def reader_left() -> None:
    """The pipe's reader left (``| head``): later writes and the flush at exit go to /dev/null."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout with no file (captured in-process)
        pass

"""Spawning the run's helper processes (the learner process, the stage calibration) safely.

Three hazards every such child shares, handled here once:

- Spawn re-runs the parent's `__main__` in the child unless it has no file and
  no spec. The children run only EBRL's modules, so re-running the caller's
  script is needless, and a hazard: a script without an
  `if __name__ == "__main__"` guard would build a second run in the child.
  `main_module_hidden` hides it while a child starts.
- Ctrl-C, `timeout`, SLURM's scancel and preemption signal the whole process
  group. The parent turns the first SIGINT/SIGTERM into "stop after this
  update" and stops its children itself, so a child that died of the same
  signal would only turn a clean stop into a crash: `ignore_group_signals`.
- A child must not outlive a parent that was SIGKILLed: the learner process
  polls its parent's pid; a child that cannot poll (the calibration, inside
  long measurements) asks the kernel to kill it (`die_with_parent`).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
from typing import Iterator

SPAWN = multiprocessing.get_context("spawn")
_PR_SET_PDEATHSIG = 1


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
  """Within the block, spawned children do not import the caller's `__main__`."""
  main = sys.modules.get("__main__")
  if main is None:
    yield
    return
  saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
  main.__dict__.pop("__file__", None)
  main.__spec__ = None
  try:
    yield
  finally:
    main.__dict__.update(saved)
    if "__spec__" not in saved:
      del main.__spec__


def ignore_group_signals() -> None:
  """In a child: SIGINT and SIGTERM sent to the process group are the parent's to act on."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)


def die_with_parent(parent_pid: int) -> None:
  """In a child of `parent_pid`: SIGKILL when the thread that started it ends (Linux; elsewhere
  nothing), and exit now if the parent is already gone.

  The kernel ties this to the parent *thread*: call it only in children whose parent thread waits
  for them (the calibration's does, in join)."""
  try:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
  except (OSError, AttributeError):
    return
  if os.getppid() != parent_pid:  # It died before prctl took effect.
    os._exit(1)  # pylint: disable=protected-access

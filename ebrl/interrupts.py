"""Ctrl-C and SIGTERM as a user means them: stop soon, keep the work, and a second one stops now.

The first SIGINT or SIGTERM only sets the run's stop event: every scheduler
checks it at its next update boundary, so the learner finishes the update it
is in (possibly its first compile), and the run then writes its checkpoint and
summary.json once, as at the end of its budget. Schedulers never see a
KeyboardInterrupt in the middle of an update, which would leave a train state
donated to an update that never returned. The first signal also puts the
signal's default action back, so a second one ends the process at once, even
inside a long compile; checkpoints are written to a temporary directory and
renamed when complete, so the last good one survives that. Inside a notebook
kernel the default action would kill the kernel and every variable in it, so
the Python API puts back the handlers that were there before instead
(`second="previous"`): the kernel's own, which raises KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _installable(handler):
  """signal.getsignal gives None for a handler installed from C; SIG_DFL is the nearest Python can set."""
  return signal.SIG_DFL if handler is None else handler


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, log: Callable[[str], None] = print,
                    second: str = "default") -> Iterator[None]:
  """Within the block, the first SIGINT/SIGTERM sets `stop`; a second one has its default effect
  (second="default") or that of the handler installed before the block (second="previous").

  Signal handlers belong to the main thread: elsewhere (a notebook's worker
  thread) the block changes nothing and Ctrl-C arrives as KeyboardInterrupt.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  if second not in ("default", "previous"):
    raise ValueError(f"second={second!r}; valid: 'default', 'previous'")
  again = "press Ctrl-C again to exit at once" if second == "default" else "interrupt again to stop at once"

  def first(signum, frame):  # pylint: disable=unused-argument
    for sig in SIGNALS:
      signal.signal(sig, signal.SIG_DFL if second == "default" else _installable(previous[sig]))
    stop.set()
    log(f"{signal.Signals(signum).name}: stopping after the current update to save a checkpoint "
        f"and the summary; {again}")

  previous = {sig: signal.signal(sig, first) for sig in SIGNALS}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, _installable(handler))

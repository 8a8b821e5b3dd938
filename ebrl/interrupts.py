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
the Python API passes the second signal to the handlers that were there
before instead (`second="previous"`): the kernel's own, which raises
KeyboardInterrupt. That exception may not land inside a checkpoint write (it
would leave Orbax's writer threads running, and the process aborts at exit), so
writes run in `uninterruptible()`: a second signal that comes during one is
held and delivered when the write is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


_held_lock = threading.Lock()
_writes_in_progress = 0
_held: list[int] = []  # Signals that came during a write, delivered when the last write ends.


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
  """A region (a checkpoint write, the final outputs) that a second signal under
  second="previous" waits for instead of interrupting; any thread may enter it."""
  global _writes_in_progress
  with _held_lock:
    _writes_in_progress += 1
  try:
    yield
  finally:
    with _held_lock:
      _writes_in_progress -= 1
      held = _held[:] if _writes_in_progress == 0 else []
      if held:
        _held.clear()
    for signum in held:
      signal.raise_signal(signum)  # Delivered to the main thread's handler, now outside any write.


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
  closing = threading.Event()  # Set first thing on the way out: the handlers install nothing more.

  def restore() -> None:
    # SIGINT last: its earlier handler may raise KeyboardInterrupt for a signal that was already on its
    # way, and by then every other handler is back. A signal landing earlier in the loop meets this
    # block's handlers, which restore everything before they raise.
    for sig in sorted(previous, key=lambda s: s == signal.SIGINT):
      signal.signal(sig, _installable(previous[sig]))

  def forward(signum, frame):
    """The earlier handler's effect, with the earlier handlers back in place first: the
    KeyboardInterrupt it may raise can land anywhere, the restoring loop below included, and
    must not leave this block's handlers installed (a notebook kernel would keep them)."""
    restore()
    handler = previous[signum]
    if callable(handler):
      handler(signum, frame)
    elif signum == signal.SIGINT:
      raise KeyboardInterrupt
    else:
      signal.signal(signum, signal.SIG_DFL)
      signal.raise_signal(signum)

  def later(signum, frame):
    """Under second="previous": the earlier handler's effect, once no write is in progress."""
    with _held_lock:
      if _writes_in_progress:
        _held.append(signum)
        return
    forward(signum, frame)

  def first(signum, frame):
    if closing.is_set():  # The block is being left: the signal is the earlier handlers' now.
      stop.set()
      forward(signum, frame)
      return
    for sig in SIGNALS:
      signal.signal(sig, signal.SIG_DFL if second == "default" else later)
    stop.set()
    log(f"{signal.Signals(signum).name}: stopping after the current update to save a checkpoint "
        f"and the summary; {again}")

  previous = {sig: signal.signal(sig, first) for sig in SIGNALS}
  try:
    yield
  finally:
    closing.set()
    restore()

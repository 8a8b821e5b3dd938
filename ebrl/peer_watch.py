"""Noticing that another process of the run is gone, and ending this one with one line.

Why: a run over several processes stands or falls together. A collective with
a dead peer fails at once, but one with a peer that is alive and stopped
(SIGSTOP, a hung host) waits forever, and with `jax_enable_recoverability`
(ebrl/distributed.py, so that JAX's coordination service does not abort the
survivors with a fatal log) nothing else times it out. So every process keeps a
sign of life in the coordination service's key-value store: its watch thread
raises its own counter every `beat_s` and reads everyone's. A process whose
counter stood still for `timeout_s`, or a store that did not answer for as long
(process 0 runs it), is lost; the watch then says which in one line and ends
this process (`on_lost`), whatever its other threads wait in. The last
checkpoint on disk is left as it is: a run resumes from it.

After a collective failed in the run's own threads, `lost(wait_s)` asks the same
question without waiting out the whole timeout: a process whose counter does
not move within `wait_s` is the one that is gone.

Process 0 is the exception JAX makes: when it dies, JAX aborts every other
process within milliseconds (a fatal log and SIGABRT), before any Python code
can look. `start` therefore turns that abort, on the other processes, into the
same line and exit code 1 (after JAX's own fatal log, which names the cause).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable

from ebrl.process_group import ProcessGroup

_PREFIX = "ebrl/alive"


def exit_lost(message: str) -> None:
  """The default `on_lost`: the line on stderr, exit code 1, at once (threads may hang in a collective)."""
  sys.stderr.write(f"error: {message}\n")
  sys.stderr.flush()
  os._exit(1)  # pylint: disable=protected-access


class PeerWatch:

  def __init__(self, group: ProcessGroup, checkpoints: str, timeout_s: float = 30.0, beat_s: float = 1.0,
               on_lost: Callable[[str], None] = exit_lost):
    from jax._src import distributed  # pylint: disable=g-import-not-at-top

    self.group, self.checkpoints = group, checkpoints
    self.timeout_s, self.beat_s, self.on_lost = timeout_s, beat_s, on_lost
    self._client = distributed.global_state.client
    now = time.monotonic()
    self._seen = {i: ("", now) for i in range(group.count)}  # Each process's counter, and when it last moved.
    self._store_ok = now  # When the store last answered.
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._beats = 0
    self._threads = [threading.Thread(target=self._beat_loop, name="peer watch: beat", daemon=True),
                     threading.Thread(target=self._judge_loop, name="peer watch: judge", daemon=True)]

  def start(self) -> "PeerWatch":
    for thread in self._threads:
      thread.start()
    if self.group.index != 0:
      self._exit_on_abort()
    return self

  def _exit_on_abort(self) -> None:
    """SIGABRT (JAX's fatal error when process 0, the coordination service, is lost) ends this
    process with the watch's line and exit code 1. A C-level handler: abort() runs it on JAX's
    own thread, where a Python signal handler would never run."""
    message = self._message([0], "JAX's distributed service stopped answering").encode()

    def on_abort(signum: int) -> None:
      del signum
      os.write(2, b"error: " + message + b"\n")
      os._exit(1)  # pylint: disable=protected-access

    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    self._on_abort = ctypes.CFUNCTYPE(None, ctypes.c_int)(on_abort)  # Kept: libc holds only its address.
    libc.signal(signal.SIGABRT, ctypes.cast(self._on_abort, ctypes.c_void_p))

  def stop(self) -> None:
    self._stop.set()

  def _beat_loop(self) -> None:
    """Raises this process's counter and reads everyone's (a call may hang while process 0 is stopped:
    the judge notices the store's silence)."""
    while not self._stop.is_set():
      try:
        self._beats += 1
        self._client.key_value_set(f"{_PREFIX}/{self.group.index}", str(self._beats), allow_overwrite=True)
        counters = dict(self._client.key_value_dir_get(_PREFIX))
      except Exception:  # pylint: disable=broad-except  # The store is gone: the judge decides when.
        self._stop.wait(self.beat_s)
        continue
      now = time.monotonic()
      with self._lock:
        self._store_ok = now
        for key, value in counters.items():
          i = int(key.rsplit("/", 1)[1])
          if i in self._seen and self._seen[i][0] != value:
            self._seen[i] = (value, now)
      self._stop.wait(self.beat_s)

  def _silent(self, seconds: float) -> list[int]:
    """Processes whose counter has not moved for `seconds`; [0] when the store itself has been
    silent that long."""
    now = time.monotonic()
    with self._lock:
      if now - self._store_ok > seconds and self.group.index != 0:
        return [0]
      return [i for i, (_, moved) in self._seen.items()
              if i != self.group.index and now - moved > seconds]

  def _judge_loop(self) -> None:
    while not self._stop.wait(self.beat_s):
      lost = self._silent(self.timeout_s)
      if lost:
        self.report(lost, f"no sign of life for {self.timeout_s:.0f} s")
        return

  def lost(self, wait_s: float) -> list[int]:
    """After a failed collective: the processes whose counters do not move on by two within
    `wait_s` (a process that just died may still show its last beat, one step on)."""
    counters = lambda: {i: int(value or 0) for i, (value, _) in self._seen.items() if i != self.group.index}
    with self._lock:
      start = counters()
    deadline = time.monotonic() + wait_s
    while True:
      with self._lock:
        behind = sorted(i for i, value in counters().items() if value < start[i] + 2)
      if not behind or time.monotonic() >= deadline:
        return behind
      time.sleep(self.beat_s / 4)

  def _message(self, lost: list[int], why: str) -> str:
    names = ", ".join(str(i) for i in lost)
    store = " (it runs the run's coordination service)" if lost == [0] else ""
    return (f"process {self.group.index}: lost process {names} of the run's {self.group.count}{store}: {why}; "
            f"stopping. The last checkpoint in {self.checkpoints} is intact: start every process again with "
            "--config.resume=True")

  def report(self, lost: list[int], why: str) -> None:
    """Ends this process (`on_lost`) with the line naming the `lost` processes and `why`."""
    self.on_lost(self._message(lost, why))

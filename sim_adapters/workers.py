"""Worker threads of a simulator-side stage, started at a moment the caller chooses.

Why not concurrent.futures.ThreadPoolExecutor: it starts its threads lazily,
one per submit, whenever it likes. A scheduler that places the simulator
stage's threads on their cores (the resource manager's sim quota) recognises
them as the threads created while the stage resets, so the workers must exist
right after `start()`. Results and exceptions travel in standard Futures.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable


class WorkerPool:

  def __init__(self, count: int, name: str):
    if count < 1:
      raise ValueError(f"{name} workers must be >= 1, got {count}")
    self.count, self.name = count, name
    self._work: queue.SimpleQueue = queue.SimpleQueue()
    self._threads: list[threading.Thread] = []
    self._native_ids: list[int] = []
    self._started = threading.Barrier(count + 1)

  def start(self) -> None:
    """Starts the threads (once; later calls do nothing)."""
    if self._threads:
      return
    self._threads = [threading.Thread(target=self._run, name=f"{self.name}{i}", daemon=True)
                     for i in range(self.count)]
    for th in self._threads:
      th.start()
    self._started.wait()  # Every thread exists and knows its native id when start() returns.

  def submit(self, fn: Callable[..., Any], *args) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._work.put((future, fn, args))
    return future

  def _run(self) -> None:
    self._native_ids.append(threading.get_native_id())
    self._started.wait()
    while True:
      item = self._work.get()
      if item is None:
        return
      future, fn, args = item
      if not future.set_running_or_notify_cancel():
        continue
      try:
        future.set_result(fn(*args))
      except BaseException as e:  # pylint: disable=broad-except  # The caller's result() raises it.
        future.set_exception(e)

  def close(self) -> None:
    for _ in self._threads:
      self._work.put(None)
    for th in self._threads:
      th.join(timeout=5.0)

  @property
  def threads(self) -> list[threading.Thread]:
    return list(self._threads)

  @property
  def native_ids(self) -> list[int]:
    """The kernel's ids of the threads (what CPU affinity is set on)."""
    return list(self._native_ids)

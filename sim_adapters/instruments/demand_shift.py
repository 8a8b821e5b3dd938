"""Injected demand shift: from a moment on, every env step costs more simulator CPU.

Why: the resource manager's claim is that it re-balances when a stage's demand
changes mid-run (a heavier scene, contact-rich phases, rendering switched on).
A claim needs a reproducible shift, so this wrapper adds `extra_us` of real
CPU work to every env step from `at_s` seconds after the first reset; physics
and every returned row are untouched.

Where the work runs matters, so it runs where a heavier simulation would: on
the simulator's worker threads (one per usable core, like EnvPool's), started
when the env is sent and finished before the env can be received. A sent
batch is split across the workers; `recv` hands out an env only once its share
of the work is done. So the extra cost is parallel across cores and gates
each env like slower physics does. (Burning in the calling thread instead
would add a serial per-batch cost no core layout can spread.)

The work is SHA-256 over a 64 KiB buffer (about 35 µs a call), timed by the
burning thread's CPU clock, not the wall clock: a shift is a demand for CPU,
and a burn timed by the wall would cost less CPU the more the cores are
contended. hashlib releases the GIL while it hashes buffers over 2 KiB, so
the burn holds the GIL about as little as EnvPool's C++ workers do; a loop
of small numpy products held it between every call (a few µs of each 5) and
slowed every other stage's Python on top of the CPU it took.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import time

import numpy as np

from sim_adapters.base import StepBatch
from sim_adapters.workers import WorkerPool

_BUFFER = bytes(64 * 1024)


def burn_cpu(seconds: float) -> None:
  """Spends `seconds` of this thread's CPU time hashing, with the GIL released."""
  end = time.thread_time() + seconds
  while time.thread_time() < end:
    hashlib.sha256(_BUFFER).digest()


class DemandShiftAdapter:
  """Wraps a SimAdapter; rows come back as the inner one returned them, later by the extra work."""

  def __init__(self, inner, at_s: float, extra_us: float, workers: int | None = None):
    if at_s < 0 or extra_us < 0:
      raise ValueError(f"demand shift needs at_s >= 0 and extra_us >= 0, got {at_s}, {extra_us}")
    self.inner, self.at_s, self.extra_us = inner, at_s, extra_us
    self._start: float | None = None
    self.shifted_at: float | None = None  # time.time() when the shift began (for plots).
    self._workers = WorkerPool(workers or len(os.sched_getaffinity(0)), "shift")
    self._done: dict[int, concurrent.futures.Future] = {}  # env id -> its share of the work.

  def __getattr__(self, name: str):
    return getattr(self.inner, name)

  def reset(self) -> None:
    self._workers.start()  # Here, so a scheduler that places sim threads adopts them.
    self.inner.reset()
    if self._start is None:
      self._start = time.perf_counter()

  def _shifted(self) -> bool:
    if self._start is None or not self.extra_us or time.perf_counter() - self._start < self.at_s:
      return False
    if self.shifted_at is None:
      self.shifted_at = time.time()
    return True

  def _start_work(self, env_ids: np.ndarray) -> list[concurrent.futures.Future]:
    """Splits the work of `env_ids` over the workers; each env waits for its part."""
    parts = []
    for part in np.array_split(np.asarray(env_ids), min(self._workers.count, len(env_ids))):
      done = self._workers.submit(burn_cpu, len(part) * self.extra_us * 1e-6)
      for i in part.tolist():
        self._done[i] = done
      parts.append(done)
    return parts

  def _wait_for(self, env_ids: np.ndarray) -> None:
    for done in {id(f): f for f in (self._done.pop(i, None) for i in env_ids.tolist()) if f is not None}.values():
      done.result()

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    self.inner.send(actions, env_ids)
    if self._shifted() and len(env_ids):
      self._start_work(env_ids)

  def recv(self) -> StepBatch:
    b = self.inner.recv()
    self._wait_for(b.env_ids)
    return b

  def step(self, actions: np.ndarray) -> StepBatch:
    b = self.inner.step(actions)
    if self._shifted():
      for done in self._start_work(b.env_ids):
        done.result()
    return b

  def can_recv(self) -> bool:
    return self.inner.can_recv()

  def close(self) -> None:
    self._workers.close()
    self.inner.close()

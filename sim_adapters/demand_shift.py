"""Injected demand shift: from a moment on, every env step costs more CPU.

Why: the resource manager's claim is that it re-balances when a stage's demand
changes mid-run (a heavier scene, contact-rich phases, rendering switched on).
A claim needs a reproducible shift, so this wrapper adds `extra_us` of real
CPU work per env step to the simulator stage from `at_s` seconds after the
first reset. The work is matrix products in numpy, which release the GIL like
EnvPool's own stepping does, so the other stages' threads keep running while
it burns; physics and every returned row are untouched.

The work is done in `send`, after the actions are handed to the simulator, so
it overlaps the physics of the envs just sent, as extra per-step work in a
simulator stage does (observation processing, a contact-rich phase on other
workers). Burning in `recv` instead would hold every env of the batch idle
while it burns, a different claim: a serial per-batch cost no core layout can
overlap.
"""

from __future__ import annotations

import time

import numpy as np

from sim_adapters.base import StepBatch

_CHUNK = 48  # A 48x48 product: tens of µs, below BLAS's multi-threading threshold.


class DemandShiftAdapter:
  """Wraps a SimAdapter; rows come back as the inner one returned them, later by the extra work."""

  def __init__(self, inner, at_s: float, extra_us: float):
    if at_s < 0 or extra_us < 0:
      raise ValueError(f"demand shift needs at_s >= 0 and extra_us >= 0, got {at_s}, {extra_us}")
    self.inner, self.at_s, self.extra_us = inner, at_s, extra_us
    self._start: float | None = None
    self.shifted_at: float | None = None  # time.time() when the shift began (for plots).
    self._a = np.random.default_rng(0).standard_normal((_CHUNK, _CHUNK)).astype(np.float32) / _CHUNK

  def __getattr__(self, name: str):
    return getattr(self.inner, name)

  def reset(self) -> None:
    self.inner.reset()
    if self._start is None:
      self._start = time.perf_counter()

  def _burn(self, rows: int) -> None:
    if self._start is None or time.perf_counter() - self._start < self.at_s or not self.extra_us:
      return
    if self.shifted_at is None:
      self.shifted_at = time.time()
    end = time.perf_counter() + rows * self.extra_us * 1e-6
    x = self._a
    while time.perf_counter() < end:
      x = np.tanh(x @ self._a)

  def recv(self) -> StepBatch:
    return self.inner.recv()

  def step(self, actions: np.ndarray) -> StepBatch:
    b = self.inner.step(actions)  # A barrier step: nothing is in flight to overlap with.
    self._burn(len(b))
    return b

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    self.inner.send(actions, env_ids)
    self._burn(len(env_ids))

  def can_recv(self) -> bool:
    return self.inner.can_recv()

  def close(self) -> None:
    self.inner.close()

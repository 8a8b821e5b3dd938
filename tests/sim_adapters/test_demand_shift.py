"""The injected demand shift: CPU work per env step from a moment on, rows untouched."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sim_adapters.base import StepBatch
from sim_adapters.instruments.demand_shift import DemandShiftAdapter


class Recording:
  """A simulator that answers at once and logs what it was asked."""

  def __init__(self, n: int):
    self.n, self.calls = n, []

  def _batch(self, ids):
    k = len(ids)
    return StepBatch(obs={"state": np.arange(k, dtype=np.float32)[:, None]}, reward=np.ones(k, np.float32),
                     terminated=np.zeros(k, bool), truncated=np.zeros(k, bool), success=np.zeros(k, np.float32),
                     env_ids=np.asarray(ids, np.int32), reset_step=np.zeros(k, bool))

  def reset(self):
    self.calls.append("reset")

  def send(self, actions, env_ids):
    self.calls.append(("send", len(env_ids)))

  def recv(self):
    self.calls.append("recv")
    return self._batch(range(self.n))

  def step(self, actions):
    return self._batch(range(self.n))

  def can_recv(self):
    return True

  def close(self):
    self.calls.append("close")


def test_shift_work_runs_on_workers_and_gates_each_env_until_done():
  inner = Recording(16)
  sim = DemandShiftAdapter(inner, at_s=0.2, extra_us=2000.0, workers=2)  # 32 ms of CPU per 16-env send.
  sim.reset()
  t0 = time.perf_counter()
  sim.send(np.zeros((16, 2)), np.arange(16))
  sim.recv()
  assert time.perf_counter() - t0 < 0.01 and sim.shifted_at is None  # Before the shift: free.
  time.sleep(0.25)
  # The workers' own CPU clocks: what other threads of this (test) process burn meanwhile does not count.
  clocks = [time.pthread_getcpuclockid(th.ident) for th in sim._workers.threads]
  workers_cpu = lambda: sum(time.clock_gettime(c) for c in clocks)
  cpu0, t0 = workers_cpu(), time.perf_counter()
  main0 = time.thread_time()
  sim.send(np.zeros((16, 2)), np.arange(16))
  assert time.thread_time() - main0 < 0.01  # send returns at once: the workers burn.
  b = sim.recv()  # ... and recv waits until they have.
  assert workers_cpu() - cpu0 == pytest.approx(0.032, rel=0.3)  # Real CPU, not a sleep.
  assert time.perf_counter() - t0 >= 0.016 * 0.9  # Two workers: at least half of it in wall time.
  assert sim.shifted_at is not None
  np.testing.assert_array_equal(b.obs["state"][:, 0], np.arange(16))  # Rows untouched.
  assert inner.calls[:2] == ["reset", ("send", 16)]
  full = sim.step(np.zeros((16, 2)))  # A barrier step pays its share before returning.
  assert len(full) == 16
  sim.close()
  assert not any(th.is_alive() for th in sim._workers.threads)


def test_shift_rejects_negative_settings():
  with pytest.raises(ValueError, match="at_s >= 0 and extra_us >= 0"):
    DemandShiftAdapter(Recording(1), at_s=-1.0, extra_us=10.0)

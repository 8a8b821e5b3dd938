"""The injected demand shift: CPU work per env step from a moment on, rows untouched."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sim_adapters.base import StepBatch
from sim_adapters.demand_shift import DemandShiftAdapter


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


def _cpu_of(fn) -> float:
  t0 = time.thread_time()
  fn()
  return time.thread_time() - t0


def test_shift_costs_cpu_in_send_from_its_moment_on_and_leaves_rows_alone():
  inner = Recording(16)
  sim = DemandShiftAdapter(inner, at_s=0.2, extra_us=2000.0)  # 2 ms per env step: 32 ms per 16-env send.
  sim.reset()
  before = _cpu_of(lambda: sim.send(np.zeros((16, 2)), np.arange(16)))
  assert before < 0.01 and sim.shifted_at is None
  time.sleep(0.25)
  after = _cpu_of(lambda: sim.send(np.zeros((16, 2)), np.arange(16)))
  assert after == pytest.approx(0.032, rel=0.5)  # Real CPU work, not a sleep.
  assert sim.shifted_at is not None
  recv_cpu = _cpu_of(sim.recv)
  assert recv_cpu < 0.01  # recv returns at once: the work overlapped the envs' physics.
  b = sim.recv()
  np.testing.assert_array_equal(b.obs["state"][:, 0], np.arange(16))
  assert inner.calls[:2] == ["reset", ("send", 16)]


def test_shift_rejects_negative_settings():
  with pytest.raises(ValueError, match="at_s >= 0 and extra_us >= 0"):
    DemandShiftAdapter(Recording(1), at_s=-1.0, extra_us=10.0)

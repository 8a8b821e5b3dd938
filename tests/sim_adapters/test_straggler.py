"""StragglerAdapter (sim_adapters/instruments/straggler.py): injected slow envs for straggler-immunity benchmarks.

Real EnvPool adapters (4 envs sync, 8 envs async with batch_size 2) check the
behaviour that matters to a benchmark: a synchronous step waits for the
straggler, asynchronous fast envs do not, and rows are the simulator's own. A
tiny in-memory adapter (`_FakeAdapter`, instant steps) checks the timing paths
that need exact control. Most tests fix `per_env_step_s` so delays are known; the latency-model tests
give the fake adapter a known step time instead.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

from sim_adapters.base import EnvSpec, ObsSpec, StepBatch
from sim_adapters.base import concat_sorted, gather_all
from sim_adapters.instruments.straggler import StragglerAdapter, straggler_set

STEP_S = 0.02  # the fixed per-env step time every timing test uses
SLOWDOWN = 5.0
EXTRA_S = (SLOWDOWN - 1) * STEP_S  # a straggler row's extra latency: 0.08 s


def _actions(adapter, n, rng):
  spec = adapter.spec
  return rng.uniform(spec.action_low, spec.action_high, size=(n, spec.action_dim)).astype(np.float32)


def _assert_same_rows(a: StepBatch, b: StepBatch):
  np.testing.assert_array_equal(a.env_ids, b.env_ids)
  assert set(a.obs) == set(b.obs)
  for k in a.obs:
    np.testing.assert_array_equal(a.obs[k], b.obs[k])
  for field in ("reward", "terminated", "truncated", "success", "reset_step"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


class _FakeAdapter:
  """Instant in-memory envs: `recv` returns the oldest `batch_size` rows sent.

  Like raw async EnvPool, a recv with fewer than `batch_size` envs in flight
  cannot return; here it raises instead of hanging. Row state is
  [env_id, rows returned by that env so far], so row integrity is checkable.
  """

  def __init__(self, num_envs: int, batch_size: int | None = None, step_s: float = 0.0):
    self.num_envs = num_envs
    self.step_s = step_s  # each recv sleeps this long, like a simulator stepping a batch
    self.batch_size = batch_size or num_envs
    self.is_async = self.batch_size < num_envs
    self.spec = EnvSpec("Fake-v0", {"state": ObsSpec((2,), np.dtype(np.float32))}, 1,
                        np.array([-1], np.float32), np.array([1], np.float32), 10, False)
    self.nan_resets = 0
    self.task_ids = np.arange(num_envs, dtype=np.int32)
    self._queue: collections.deque[int] = collections.deque()
    self._count = np.zeros(num_envs, np.int64)

  def reset(self):
    self._queue = collections.deque(range(self.num_envs))

  def send(self, actions, env_ids):
    self._queue.extend(int(i) for i in env_ids)

  def can_recv(self):
    return len(self._queue) >= self.batch_size

  def recv(self):
    assert len(self._queue) >= self.batch_size, "raw recv would block forever"
    if self.step_s:
      time.sleep(self.step_s)
    ids = np.array([self._queue.popleft() for _ in range(self.batch_size)], np.int32)
    state = np.stack([ids, self._count[ids]], axis=1).astype(np.float32)
    self._count[ids] += 1
    n = len(ids)
    return StepBatch({"state": state}, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool),
                     np.full(n, np.nan, np.float32), ids, np.zeros(n, bool))

  def step(self, actions):
    self.send(actions, np.arange(self.num_envs))
    return gather_all(self, self.num_envs)

  def reset_envs(self, env_ids):
    pass

  def close(self):
    pass


# -- the straggler set -------------------------------------------------------------


@pytest.mark.parametrize("num_envs,fraction,count", [
    (8, 0.0, 0), (8, 0.01, 1), (8, 0.25, 2), (8, 0.5, 4), (5, 0.5, 3), (8, 1.0, 8), (100, 0.1, 10)])
def test_straggler_set_size(num_envs, fraction, count):
  ids = straggler_set(num_envs, fraction, seed=3)
  assert ids.dtype == np.int32 and len(ids) == count
  assert len(np.unique(ids)) == count and ((ids >= 0) & (ids < num_envs)).all()
  adapter = StragglerAdapter(_FakeAdapter(num_envs), fraction, SLOWDOWN, seed=3)
  np.testing.assert_array_equal(adapter.straggler_ids, ids)


def test_straggler_set_is_seeded():
  np.testing.assert_array_equal(straggler_set(64, 0.25, seed=7), straggler_set(64, 0.25, seed=7))
  assert len({tuple(straggler_set(64, 0.25, seed=s)) for s in range(5)}) > 1


@pytest.mark.parametrize("fraction,slowdown", [(-0.1, 2.0), (1.5, 2.0), (0.5, 0.5)])
def test_rejects_bad_settings(fraction, slowdown):
  with pytest.raises(ValueError):
    StragglerAdapter(_FakeAdapter(4), fraction, slowdown)


def test_attribute_passthrough(make):
  fake = _FakeAdapter(4, batch_size=2)
  wrapped = StragglerAdapter(fake, 0.5, SLOWDOWN)
  assert wrapped.spec is fake.spec and wrapped.num_envs == 4
  assert wrapped.task_ids is fake.task_ids
  assert wrapped.is_async and wrapped.batch_size == 2
  fake.nan_resets = 3
  assert wrapped.nan_resets == 3
  plain = StragglerAdapter(make("MetaWorld/Reach-v3", 2), 0.5, SLOWDOWN)
  assert not hasattr(plain, "task_ids") and not hasattr(plain, "instructions")


# -- no stragglers: a passthrough ------------------------------------------------------


@pytest.mark.parametrize("fraction,slowdown", [(0.0, SLOWDOWN), (0.5, 1.0)])
def test_no_slowdown_is_a_passthrough(make, fraction, slowdown):
  plain = make("MetaWorld/Reach-v3", 4, seed=0)
  inner = make("MetaWorld/Reach-v3", 4, seed=0)
  returned = []
  inner_recv, inner_step = inner.recv, inner.step
  inner.recv = lambda: returned.append(inner_recv()) or returned[-1]
  inner.step = lambda a: returned.append(inner_step(a)) or returned[-1]
  wrapped = StragglerAdapter(inner, fraction, slowdown, per_env_step_s=STEP_S)
  assert not wrapped.active and wrapped.extra_latency_s(1.0) == 0.0
  plain.reset()
  wrapped.reset()
  _assert_same_rows(gather_all(wrapped, 4), gather_all(plain, 4))
  rng = np.random.default_rng(0)
  t0 = time.perf_counter()
  for _ in range(3):
    actions = _actions(plain, 4, rng)
    got = wrapped.step(actions)
    assert got is returned[-1]  # the inner adapter's own batch, untouched
    _assert_same_rows(got, plain.step(actions))
  assert time.perf_counter() - t0 < 3 * EXTRA_S  # no straggler delay anywhere


# -- synchronous: one straggler slows every step ------------------------------------------


def test_sync_step_waits_for_the_straggler(make):
  plain = make("MetaWorld/Reach-v3", 4, seed=0)
  wrapped = StragglerAdapter(make("MetaWorld/Reach-v3", 4, seed=0), 0.25, SLOWDOWN, per_env_step_s=STEP_S)
  assert len(wrapped.straggler_ids) == 1
  assert wrapped.extra_latency_s(123.0) == pytest.approx(EXTRA_S)  # fixed: whatever the latency
  plain.reset()
  wrapped.reset()
  _assert_same_rows(gather_all(wrapped, 4), gather_all(plain, 4))
  rng = np.random.default_rng(0)
  for _ in range(3):
    actions = _actions(plain, 4, rng)
    t0 = time.perf_counter()
    expected = plain.step(actions)
    plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = wrapped.step(actions)
    wrapped_s = time.perf_counter() - t0
    assert wrapped_s >= EXTRA_S, wrapped_s
    assert wrapped_s < plain_s + EXTRA_S + 0.5, (wrapped_s, plain_s)
    _assert_same_rows(got, expected)  # the straggler is slow, not different
  assert wrapped.delayed_rows == 4  # its reset row and three steps


def test_latency_model_sync_step_takes_slowdown_times_as_long():
  """Without a fixed step time, one straggler makes a barrier step `slowdown` times longer."""
  fake = _FakeAdapter(4, step_s=STEP_S)
  wrapped = StragglerAdapter(fake, 0.25, SLOWDOWN)
  assert wrapped.extra_latency_s(STEP_S) == pytest.approx(EXTRA_S)
  wrapped.reset()
  gather_all(wrapped, 4)
  for _ in range(3):
    t0 = time.perf_counter()
    wrapped.step(np.zeros((4, 1), np.float32))
    elapsed = time.perf_counter() - t0
    assert SLOWDOWN * STEP_S <= elapsed < SLOWDOWN * STEP_S + 0.1, elapsed


def test_latency_model_async_straggler_scales_its_own_round_trip():
  """Async: a straggler's row is due `slowdown` times its own send-to-ready latency after its send."""
  fake = _FakeAdapter(4, batch_size=1, step_s=STEP_S)
  wrapped = StragglerAdapter(fake, 0.25, SLOWDOWN, seed=0)
  (slow,) = wrapped.straggler_ids
  wrapped.reset()
  gather_all(wrapped, 4)  # every env's reset row
  sent = time.perf_counter()
  wrapped.send(np.zeros((4, 1), np.float32), np.arange(4))
  times = {}
  while len(times) < 4:
    b = wrapped.recv()
    for i in b.env_ids:
      times[int(i)] = time.perf_counter() - sent
  fast = [times[i] for i in range(4) if i != slow]
  # Fast envs come back one inner step after another; the straggler is not among the first three.
  assert max(fast) < times[slow]
  # Its inner latency was at least one inner step, so it is released no sooner than slowdown steps.
  assert times[slow] >= SLOWDOWN * STEP_S
  # ... and the fast envs were not held back by it: all three are out within four inner steps.
  assert max(fast) < 4 * STEP_S + 0.05


# -- asynchronous: fast envs never wait -----------------------------------------------------


def _check_rows(adapter, batch, owed):
  """Row types and the in-flight rule: only envs that owe a row may return one."""
  ids = batch.env_ids
  assert batch.env_ids.dtype == np.int32 and batch.reward.shape == ids.shape
  assert batch.obs["state"].shape == (len(ids), *adapter.spec.obs["state"].shape)
  assert len(np.unique(ids)) == len(ids), ids
  assert (owed[ids] > 0).all(), f"received {ids} but owed {owed}"
  owed[ids] -= 1


def test_async_fast_envs_outpace_stragglers(make):
  inner = make("MetaWorld/Reach-v3", 8, batch_size=2)
  wrapped = StragglerAdapter(inner, 0.25, SLOWDOWN, seed=1, per_env_step_s=STEP_S)
  slow = wrapped.straggler_ids
  assert len(slow) == 2
  rng = np.random.default_rng(0)
  owed = np.ones(8, np.int64)
  counts = np.zeros(8, np.int64)
  sent_at = np.zeros(8)
  wrapped.reset()
  sent_at[:] = time.perf_counter()
  end = time.perf_counter() + 1.0
  while time.perf_counter() < end:
    batch = wrapped.recv()
    now = time.perf_counter()
    assert 1 <= len(batch) <= 2  # never more than the inner batch size
    _check_rows(wrapped, batch, owed)
    counts[batch.env_ids] += 1
    # A straggler's row is held for the extra latency, never less.
    late = np.isin(batch.env_ids, slow)
    assert (now - sent_at[batch.env_ids[late]] >= EXTRA_S).all()
    wrapped.send(_actions(wrapped, len(batch), rng), batch.env_ids)
    owed[batch.env_ids] += 1
    sent_at[batch.env_ids] = time.perf_counter()
  assert owed.sum() == 8 == wrapped.in_flight
  fast = np.setdiff1d(np.arange(8), slow)
  # At most one step per extra latency for a straggler, many more for the others.
  assert counts[slow].max() <= 1.0 / EXTRA_S + 1, counts
  assert counts[slow].min() >= 3, counts  # slow, but they do come back
  assert counts[fast].min() >= 2 * counts[slow].max(), counts
  # Rows delayed so far: those received plus those still held (at most one per straggler).
  assert counts[slow].sum() <= wrapped.delayed_rows <= counts[slow].sum() + len(slow)

  # Drain: every row owed comes back, except fewer than one inner batch that raw
  # async EnvPool can never return; recv then raises instead of blocking forever.
  deadline = time.perf_counter() + 2.0
  with pytest.raises(RuntimeError, match="block forever|no envs in flight"):
    while time.perf_counter() < deadline:
      _check_rows(wrapped, wrapped.recv(), owed)
  assert owed.sum() == wrapped.in_flight < 2
  assert not owed[slow].any()  # held straggler rows all came out


def test_async_single_env_batches_drain_completely(make):
  wrapped = StragglerAdapter(make("MetaWorld/Reach-v3", 4, batch_size=1), 0.5, SLOWDOWN,
                             per_env_step_s=STEP_S)
  rng = np.random.default_rng(0)
  owed = np.ones(4, np.int64)
  wrapped.reset()
  for _ in range(30):
    batch = wrapped.recv()
    _check_rows(wrapped, batch, owed)
    wrapped.send(_actions(wrapped, len(batch), rng), batch.env_ids)
    owed[batch.env_ids] += 1
  while owed.any():
    _check_rows(wrapped, wrapped.recv(), owed)
  assert wrapped.in_flight == 0
  with pytest.raises(RuntimeError, match="no envs in flight"):
    wrapped.recv()


def test_held_rows_wait_by_sleeping_and_keep_their_data():
  """Only stragglers in flight: recv sleeps until the earliest is due, then rows come out whole."""
  fake = _FakeAdapter(4, batch_size=2)
  wrapped = StragglerAdapter(fake, 1.0, SLOWDOWN, per_env_step_s=STEP_S)
  wrapped.reset()
  t0 = time.perf_counter()
  got = [wrapped.recv()]
  assert time.perf_counter() - t0 >= EXTRA_S
  while sum(len(b) for b in got) < 4:
    got.append(wrapped.recv())
  assert time.perf_counter() - t0 < EXTRA_S + 0.5
  rows = concat_sorted(got)
  np.testing.assert_array_equal(rows.env_ids, np.arange(4))
  np.testing.assert_array_equal(rows.obs["state"], [[i, 0] for i in range(4)])
  with pytest.raises(RuntimeError, match="no envs in flight"):
    wrapped.recv()


def test_fast_rows_are_not_held_back_by_a_straggler_in_their_batch():
  fake = _FakeAdapter(4, batch_size=2)
  wrapped = StragglerAdapter(fake, 0.25, SLOWDOWN, per_env_step_s=STEP_S)
  (slow,) = wrapped.straggler_ids
  wrapped.reset()
  t0 = time.perf_counter()
  first = [wrapped.recv(), wrapped.recv()]
  assert time.perf_counter() - t0 < EXTRA_S / 2  # three fast rows, no wait
  assert slow not in np.concatenate([b.env_ids for b in first])
  last = wrapped.recv()  # only the straggler is left: it comes out once due
  assert time.perf_counter() - t0 >= EXTRA_S
  np.testing.assert_array_equal(last.env_ids, [slow])
  np.testing.assert_array_equal(last.obs["state"], [[slow, 0]])


def test_step_refuses_while_rows_are_held():
  wrapped = StragglerAdapter(_FakeAdapter(4), 1.0, SLOWDOWN, per_env_step_s=STEP_S)
  wrapped.reset()
  wrapped._pull()  # pylint: disable=protected-access
  with pytest.raises(RuntimeError, match="still owed"):
    wrapped.step(np.zeros((4, 1), np.float32))

"""Injected stragglers: a fixed subset of envs steps `slowdown` times slower.

Why: EBRL's claim is straggler immunity (an asynchronous scheduler keeps the
fast envs busy while a slow one finishes), and a claim needs a measurement. The
real simulators are uniform, so this wrapper makes some envs slow on purpose;
`--straggler_fraction=f --straggler_slowdown=s` builds it around any adapter.

Two models of a straggler's extra latency, both leaving physics untouched (a
row carries exactly what the inner adapter returned) and both costing no CPU
(a slow env waits, as an env behind a slow renderer, a remote simulator or a
heavier scene on its own worker does):

* Latency model (default, `per_env_step_s=None`): a straggler's step takes
  `slowdown` times the latency it had in the inner adapter, counted from its
  `send` (or from the start of the `recv` that returned it, if later) to the
  end of that `recv`: the time the caller actually waited on it. Its row is
  released `(slowdown - 1) * latency` after the inner adapter returned it. In
  a synchronous `step` every env's latency is the whole batch's step time, so
  one straggler makes the step `slowdown` times longer, which is what a barrier
  does to a batch with a slow env; in asynchronous use the other envs carry on
  meanwhile. Counting only waited time keeps delays from compounding (a wait
  for one straggler is not part of the next straggler's latency), at the price
  of under-counting rows that finished while the caller was busy elsewhere, so
  comparisons between schedulers should use the fixed model.
* Fixed model (`per_env_step_s` given): the extra latency is
  `(slowdown - 1) * per_env_step_s`, the same for every scheduler. With a
  per-env step time far below a batched simulator's batch time (EnvPool steps
  many envs on a few threads) the straggler hides inside the batch; this model
  shows how little a CPU-cost-sized straggler matters to a barrier.

* Asynchronous use (`send`/`recv`): `recv` returns the rows that are due now;
  a straggler's row waits in a small heap and a later `recv` returns it once
  due, so fast envs never wait for it.
* Synchronous use (`step`): every env must come back, so `step` waits until
  the straggler row is due.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time

import numpy as np

from sim_adapters.base import EnvSpec, StepBatch
from sim_adapters.base import concat_sorted

def straggler_set(num_envs: int, fraction: float, seed: int = 0) -> np.ndarray:
  """The straggler env ids: round(fraction * num_envs) of them, at least one when fraction > 0.

  Seeded and independent of the simulator, so every scheduler in a comparison
  gets the same stragglers. Rounds half up (not Python's half-to-even), so
  fraction 0.5 of 5 envs gives 3.
  """
  if not 0.0 <= fraction <= 1.0:
    raise ValueError(f"straggler_fraction must be in [0, 1], got {fraction}")
  if fraction == 0.0:
    return np.zeros(0, np.int32)
  count = min(num_envs, max(1, int(math.floor(fraction * num_envs + 0.5))))
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(num_envs, size=count, replace=False)).astype(np.int32)


class StragglerAdapter:
  """A SimAdapter whose `straggler_ids` envs step `slowdown` times slower than the rest.

  With `fraction == 0` or `slowdown == 1` every call goes straight to `inner`
  and its rows come back unchanged (the very same objects), adding no delay.
  """

  def __init__(self, inner, fraction: float, slowdown: float, seed: int = 0, *,
               per_env_step_s: float | None = None):
    if slowdown < 1.0:
      raise ValueError(f"straggler_slowdown must be >= 1, got {slowdown}")
    if per_env_step_s is not None and per_env_step_s < 0:
      raise ValueError(f"per_env_step_s must be >= 0, got {per_env_step_s}")
    self.inner = inner
    self.spec: EnvSpec = inner.spec
    self.num_envs: int = inner.num_envs
    self.fraction = float(fraction)
    self.slowdown = float(slowdown)
    self.straggler_ids = straggler_set(self.num_envs, self.fraction, seed)
    self._is_straggler = np.zeros(self.num_envs, bool)
    self._is_straggler[self.straggler_ids] = True
    self.active = len(self.straggler_ids) > 0 and self.slowdown > 1.0
    self._fixed_step_s = per_env_step_s
    self._sent_at = np.zeros(self.num_envs)  # When each env's step (or reset) was started.
    # The raw EnvPool behind an async adapter waits for `batch_size` envs in
    # `recv`; fewer in flight would block it forever. Returning at most that many
    # rows per `recv` also keeps the batch-size bound callers may size buffers by.
    # Rows per recv stay within the inner adapter's batch size, which callers may size buffers by.
    inner_batch = int(getattr(inner, "batch_size", None) or self.num_envs)
    self._max_rows = inner_batch if getattr(inner, "is_async", False) else self.num_envs
    self._inner_in_flight = 0  # rows the inner adapter still owes us
    self._held: list[tuple[float, int, StepBatch]] = []  # (due time, tie-break, rows)
    self._seq = itertools.count()
    self.delayed_rows = 0  # straggler rows released late, for benchmark reports

  # -- passthrough -------------------------------------------------------------

  def __getattr__(self, name: str):
    # Only reached for attributes this class lacks: `task_ids`, `instructions`,
    # `is_async`, `batch_size`, ... exist exactly when the inner adapter has them.
    if name == "inner":  # not set yet (e.g. during unpickling): avoid recursion
      raise AttributeError(name)
    return getattr(self.inner, name)

  @property
  def nan_resets(self) -> int:
    return self.inner.nan_resets

  def extra_latency_s(self, latency_s: float) -> float:
    """How much later than its inner adapter a straggler's row is released, given its inner latency."""
    if not self.active:
      return 0.0
    step_s = self._fixed_step_s if self._fixed_step_s is not None else latency_s
    return (self.slowdown - 1.0) * step_s

  @property
  def in_flight(self) -> int:
    """Rows owed to the caller: still in the inner adapter or held here."""
    return self._inner_in_flight + sum(len(b) for _, _, b in self._held)

  # -- SimAdapter --------------------------------------------------------------

  def reset(self) -> None:
    self._held.clear()
    self._sent_at[:] = time.perf_counter()
    self.inner.reset()
    self._inner_in_flight = self.num_envs

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    self._inner_in_flight += len(env_ids)
    self._sent_at[np.asarray(env_ids)] = time.perf_counter()
    self.inner.send(actions, env_ids)

  def _pull(self) -> None:
    """One inner `recv`: fast rows are due now, straggler rows after the extra latency."""
    t0 = time.perf_counter()
    b = self.inner.recv()
    t1 = time.perf_counter()
    self._inner_in_flight -= len(b)
    slow = self._is_straggler[b.env_ids]
    if not slow.any():
      heapq.heappush(self._held, (t1, next(self._seq), b))
      return
    fast_idx, slow_idx = np.flatnonzero(~slow), np.flatnonzero(slow)
    if len(fast_idx):
      heapq.heappush(self._held, (t1, next(self._seq), b.take(fast_idx)))
    # Each straggler row is due after its own extra latency (from its own send, or the wait's start).
    for i in slow_idx:
      due = t1 + self.extra_latency_s(t1 - max(t0, self._sent_at[b.env_ids[i]]))
      heapq.heappush(self._held, (due, next(self._seq), b.take(np.array([i]))))
    self.delayed_rows += len(slow_idx)

  def _pop_due(self, now: float) -> list[StepBatch]:
    """The held rows due by `now`, earliest first, at most `_max_rows` of them."""
    out, count = [], 0
    while self._held and self._held[0][0] <= now and count < self._max_rows:
      due, seq, b = heapq.heappop(self._held)
      room = self._max_rows - count
      if len(b) > room:  # split: the rest stays due and goes out with the next recv
        heapq.heappush(self._held, (due, seq, b.take(np.arange(room, len(b)))))
        b = b.take(np.arange(room))
      out.append(b)
      count += len(b)
    return out

  def can_recv(self) -> bool:
    """Whether `recv` can return: a row is held (it falls due) or the inner adapter can return."""
    return bool(self._held) or self.inner.can_recv()

  def recv(self) -> StepBatch:
    """The rows due now; waits for the next inner batch or the earliest held row.

    Simplification: with enough envs in flight in the inner adapter, the wait is
    a blocking inner `recv` (EnvPool's has no timeout), so a held row that falls
    due meanwhile goes out with the next inner batch, at most one inner batch
    time late. With too few envs in flight for the inner `recv` to return, the
    wait is a sleep until the earliest held row is due, never a spin.
    """
    if not self.active:
      return self.inner.recv()
    while True:
      due = self._pop_due(time.perf_counter())
      if due:
        return concat_sorted(due)
      if self.inner.can_recv():
        self._pull()
      elif self._held:
        time.sleep(max(0.0, self._held[0][0] - time.perf_counter()))
      elif self._inner_in_flight > 0:
        raise RuntimeError(
            f"recv() would block forever: {self._inner_in_flight} envs in flight, too few for the "
            "inner adapter to return a batch; send() more envs first")
      else:
        raise RuntimeError("recv() called with no envs in flight; send() first")

  def step(self, actions: np.ndarray) -> StepBatch:
    """Steps every env; returns once the slowest straggler is due, rows ordered by env id."""
    if not self.active:
      return self.inner.step(actions)
    if self._held:
      raise RuntimeError(f"step() with {self.in_flight} rows still owed by recv(); receive them first")
    t0 = time.perf_counter()
    b = self.inner.step(actions)
    t1 = time.perf_counter()
    # Every env is in the batch, stragglers included: the batch is ready when they are.
    self.delayed_rows += len(self.straggler_ids)
    delay = t1 + self.extra_latency_s(t1 - t0) - time.perf_counter()
    if delay > 0:
      time.sleep(delay)
    return b

  def reset_envs(self, env_ids: np.ndarray) -> None:
    self.inner.reset_envs(env_ids)

  def close(self) -> None:
    self._held.clear()
    self.inner.close()

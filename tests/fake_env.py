"""A SimAdapter with random step latencies and EnvPool's asynchronous batching, for scheduler tests.

Why a fake: the staleness bound, the parking of envs and the deadlock breaker
depend on timing (stragglers, a slow learner, groups that cannot return a whole
batch), which a real simulator on a loaded 2-core machine neither varies nor
repeats. Like async EnvPool, `recv` returns exactly `batch_size` envs, the
first to finish, and cannot return with fewer in flight (`can_recv`).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from sim_adapters.base import EnvSpec, StepBatch, concat_step_batches


class FakeAsyncEnv:

  def __init__(self, spec: EnvSpec, num_envs: int, batch_size: int, step_s: np.ndarray, seed: int = 0,
               jitter: float = 0.5, episode_steps: int = 7):
    """step_s[i]: env i's mean step latency; each step takes it times U(1 - jitter, 1 + jitter)."""
    self.spec, self.num_envs, self.batch_size = spec, num_envs, batch_size
    self.is_async = batch_size < num_envs
    self._step_s = np.asarray(step_s, np.float64)
    self._jitter, self._episode_steps = jitter, episode_steps
    self._rng = np.random.default_rng(seed)
    self._ready_at = np.full(num_envs, np.inf)  # When each env in flight finishes; inf: not in flight.
    self._t = np.zeros(num_envs, np.int64)  # Steps into the current episode.
    self._reset_next = np.ones(num_envs, bool)
    self._lock = threading.Lock()
    self.nan_resets = 0
    self.sends = 0  # Steps sent (resets included).

  def _launch(self, ids: np.ndarray) -> None:
    now = time.monotonic()
    scale = self._rng.uniform(1.0 - self._jitter, 1.0 + self._jitter, len(ids))
    self._ready_at[ids] = now + self._step_s[ids] * scale
    self.sends += len(ids)

  def reset(self) -> None:
    with self._lock:
      self._t[:] = 0
      self._reset_next[:] = True
      self._launch(np.arange(self.num_envs))

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int64)
    with self._lock:
      if np.isfinite(self._ready_at[env_ids]).any():
        raise RuntimeError(f"send to envs in flight: {env_ids[np.isfinite(self._ready_at[env_ids])].tolist()}")
      self._launch(env_ids)

  def can_recv(self) -> bool:
    with self._lock:
      return int(np.isfinite(self._ready_at).sum()) >= self.batch_size

  def recv(self) -> StepBatch:
    with self._lock:
      flying = np.flatnonzero(np.isfinite(self._ready_at))
      if len(flying) < self.batch_size:
        raise RuntimeError(f"recv with {len(flying)} envs in flight needs {self.batch_size}")
      ids = flying[np.argsort(self._ready_at[flying], kind="stable")[:self.batch_size]]
      wait = float(self._ready_at[ids].max()) - time.monotonic()
    if wait > 0:
      time.sleep(wait)
    with self._lock:
      self._ready_at[ids] = np.inf
      return self._rows(np.sort(ids))

  def _rows(self, ids: np.ndarray) -> StepBatch:
    n = len(ids)
    reset_step = self._reset_next[ids].copy()
    self._t[ids] = np.where(reset_step, 0, self._t[ids] + 1)
    truncated = self._t[ids] >= self._episode_steps
    terminated = ~truncated & ~reset_step & (self._rng.random(n) < 0.05)
    self._reset_next[ids] = terminated | truncated
    obs = {k: self._rng.normal(size=(n,) + v.shape).astype(v.dtype) for k, v in self.spec.obs.items()}
    reward = np.where(reset_step, 0.0, self._rng.normal(size=n)).astype(np.float32)
    success = np.where(terminated, 1.0, 0.0).astype(np.float32)
    return StepBatch(obs, reward, terminated, truncated, success, ids.astype(np.int32), reset_step)

  def step(self, actions: np.ndarray) -> StepBatch:
    self.send(actions, np.arange(self.num_envs))
    batches, count = [], 0
    while count < self.num_envs:
      batches.append(self.recv())
      count += len(batches[-1])
    b = concat_step_batches(batches)
    return b.take(np.argsort(b.env_ids))

  def reset_envs(self, env_ids: np.ndarray) -> None:
    with self._lock:
      self._reset_next[np.asarray(env_ids)] = True

  def close(self) -> None:
    pass

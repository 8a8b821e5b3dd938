"""Per-env trajectory assembly: independent envs in, fixed-length segments out.

Envs come back from the simulator in any order and any grouping. For every env
the assembler keeps the transitions of its current segment; when an env has T
transitions, its segment is cut and handed on with the observation that follows
its last step (the learner bootstraps from it). Episode boundaries stay inside
a segment (`done` marks them), as in a synchronous [T, N] rollout.

Protocol, per batch of ready rows (global env ids):
  1. `complete(rows)` closes the pending transition of each env with the row's
     reward/terminated/done/valid and returns the envs whose segment is now full
     (their segments are emitted through `emit`);
  2. `begin(env_ids, start_version, forced)` for the envs whose next action
     starts a segment (`needs_new_segment`): the queue's grant, which the
     segment carries to the learner (ebrl/trajectories/queue.py);
  3. `start(env_ids, obs, actions, version)` records the action just generated
     for each env's observation as the env's new pending transition.
A row of an env with no pending transition (its first reset) only starts one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ebrl.sampler import Actions
from sim_adapters.base import EnvSpec, StepBatch


@dataclasses.dataclass
class Segment:
  """T consecutive transitions of one env, plus the observation after them."""

  env_id: int
  obs: dict[str, np.ndarray]  # [T + 1, ...]: obs[T] bootstraps
  actions: np.ndarray  # [T, A]
  logp: np.ndarray  # [T]
  rewards: np.ndarray  # [T]
  terminated: np.ndarray  # [T] bool
  done: np.ndarray  # [T] bool
  valid: np.ndarray  # [T] bool
  version: np.ndarray  # [T] int32
  discount: np.ndarray | None = None  # [T] float32 when the rows carry one (chunks), else gamma
  start_version: int = 0  # The learner version its start was granted at (the queue's deadline key).
  forced: bool = False  # Started beyond capacity by the deadlock breaker.


class TrajectoryAssembler:

  def __init__(self, spec: EnvSpec, num_envs: int, horizon: int, emit: Callable[[Segment], None],
               action_size: int | None = None):
    n, t = num_envs, horizon
    self.horizon = horizon
    self._emit = emit
    self.obs = {k: np.zeros((n, t + 1) + v.shape, v.dtype) for k, v in spec.obs.items()}
    self.actions = np.zeros((n, t, action_size or spec.action_dim), np.float32)  # The policy's raw actions.
    self.logp = np.zeros((n, t), np.float32)
    self.rewards = np.zeros((n, t), np.float32)
    self.terminated = np.zeros((n, t), bool)
    self.done = np.zeros((n, t), bool)
    self.valid = np.zeros((n, t), bool)
    self.version = np.zeros((n, t), np.int32)
    self.discount: np.ndarray | None = None  # Allocated by the first row that carries one.
    self.count = np.zeros(n, np.int64)  # Completed transitions in the current segment.
    self.pending = np.zeros(n, bool)  # An action was sent and its result is awaited.
    self.start_version = np.zeros(n, np.int64)  # Of each env's current segment (see `begin`).
    self.forced = np.zeros(n, bool)

  def complete(self, env_ids: np.ndarray, rows: StepBatch) -> np.ndarray:
    """Closes pending transitions; returns a bool mask of rows whose env emitted a segment."""
    has = self.pending[env_ids]
    ids = env_ids[has]
    pos = self.count[ids]
    self.rewards[ids, pos] = rows.reward[has]
    self.terminated[ids, pos] = rows.terminated[has]
    self.done[ids, pos] = rows.done[has]
    self.valid[ids, pos] = ~rows.reset_step[has]
    if rows.discount is not None:
      if self.discount is None:
        self.discount = np.ones(self.valid.shape, np.float32)
      self.discount[ids, pos] = rows.discount[has]
    self.count[ids] += 1
    self.pending[ids] = False
    full = np.zeros(len(env_ids), bool)
    full[has] = self.count[ids] == self.horizon
    for r in np.flatnonzero(full):
      i = env_ids[r]
      for k, v in self.obs.items():
        v[i, self.horizon] = rows.obs[k][r]
      self._emit(Segment(
          env_id=int(i), obs={k: v[i].copy() for k, v in self.obs.items()},
          actions=self.actions[i].copy(), logp=self.logp[i].copy(), rewards=self.rewards[i].copy(),
          terminated=self.terminated[i].copy(), done=self.done[i].copy(), valid=self.valid[i].copy(),
          version=self.version[i].copy(), discount=None if self.discount is None else self.discount[i].copy(),
          start_version=int(self.start_version[i]), forced=bool(self.forced[i])))
      self.count[i] = 0
    return full

  def needs_new_segment(self, env_ids: np.ndarray) -> np.ndarray:
    """True for envs whose next action starts a segment (the staleness throttle counts these)."""
    return self.count[env_ids] == 0

  def begin(self, env_ids: np.ndarray, start_version: int, forced: bool = False) -> None:
    """Records the queue's grant for envs whose next action starts a segment."""
    self.start_version[env_ids] = start_version
    self.forced[env_ids] = forced

  def start(self, env_ids: np.ndarray, obs: dict[str, np.ndarray], actions: Actions, version: int) -> None:
    pos = self.count[env_ids]
    for k, v in self.obs.items():
      v[env_ids, pos] = obs[k]
    self.actions[env_ids, pos] = actions.action
    self.logp[env_ids, pos] = actions.logp
    self.version[env_ids, pos] = version
    self.pending[env_ids] = True

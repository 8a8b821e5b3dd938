"""Action chunks: every env executes its whole chunk of K actions and comes back on its own.

Why here: VLA and flow policies emit K actions per decision (OpenVLA-OFT, pi0).
Executing a chunk is simulation work, so it belongs to the simulator stage: the
wrapper sends an env's next action as soon as its previous one returns, without
waiting for the other envs or for the policy, and hands the env back to the
scheduler only when its chunk is done. The schedulers see one transition per
chunk (obs before the chunk, the K*A chunk action, the chunk's reward); an env
that finishes early never waits for a slow one.

A chunk ends early when its episode ends (the rest of the chunk is dropped, as
a real robot stops at success or a limit) or when the env comes back from a
reset (an action chosen for the old episode's state means nothing in the new
one). Rewards:
  reward_type="chunk"   the chunk's reward is the sum of its actions' rewards;
                        the learner discounts once per chunk.
  reward_type="action"  the chunk's reward is sum_i gamma^i r_i over its
                        actions, the return a per-action learner would see;
                        the learner then discounts by gamma^j per chunk of j
                        actions (the semi-MDP view of a chunk): gamma^K for a
                        whole chunk, less for one its episode's end cut short
                        (a truncation bootstraps from a state j actions away).
                        Rows carry it as `discount`.
success is the max over the chunk's actions (NaN when the task has none).

The inner adapter must be asynchronous (send/recv per env): `make_adapter`
builds it so. `sim_steps` counts the physics steps actually taken.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sim_adapters.base import StepBatch, Wrapper

REWARD_TYPES = ("chunk", "action")


class ChunkAdapter(Wrapper):
  """Wraps an asynchronous SimAdapter whose actions are one step; takes K-step chunks."""

  def __init__(self, inner, chunk_size: int, reward_type: str = "chunk", gamma: float = 0.99):
    if chunk_size < 1:
      raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if reward_type not in REWARD_TYPES:
      raise ValueError(f"reward_type={reward_type!r}; valid: {', '.join(REWARD_TYPES)}")
    self.inner, self.chunk_size, self.reward_type, self.gamma = inner, chunk_size, reward_type, gamma
    self.num_envs = inner.num_envs
    a, k = inner.spec.action_dim, chunk_size
    self.spec = dataclasses.replace(inner.spec, action_dim=k * a, action_low=np.tile(inner.spec.action_low, k),
                                    action_high=np.tile(inner.spec.action_high, k), chunk_size=k)
    n = self.num_envs
    self._actions = np.zeros((n, k, a), np.float32)
    self._pos = np.zeros(n, np.int64)  # Actions of the current chunk already returned.
    self._reward = np.zeros(n, np.float64)
    self._success = np.full(n, np.nan, np.float32)
    self.sim_steps = 0

  def __getattr__(self, name: str):
    return getattr(self.inner, name)

  def _start(self, env_ids: np.ndarray) -> None:
    self._pos[env_ids] = 0
    self._reward[env_ids] = 0.0
    self._success[env_ids] = np.nan

  def reset(self) -> None:
    self._start(np.arange(self.num_envs))
    self.inner.reset()

  def send(self, actions: np.ndarray, env_ids: np.ndarray) -> None:
    env_ids = np.asarray(env_ids, np.int32)
    if not len(env_ids):
      return
    self._actions[env_ids] = np.asarray(actions, np.float32).reshape(len(env_ids), self.chunk_size, -1)
    self._start(env_ids)
    self.inner.send(self._actions[env_ids, 0], env_ids)

  def recv(self) -> StepBatch:
    """The envs whose chunks finished; the others get their next action at once."""
    while True:
      b = self.inner.recv()
      ids = b.env_ids
      self.sim_steps += int((~b.reset_step).sum())
      weight = 1.0 if self.reward_type == "chunk" else self.gamma ** self._pos[ids]
      self._reward[ids] += weight * b.reward
      self._success[ids] = np.fmax(self._success[ids], b.success)
      self._pos[ids] += 1
      finished = b.done | b.reset_step | (self._pos[ids] >= self.chunk_size)
      go_on = ~finished
      if go_on.any():
        more = ids[go_on]
        self.inner.send(self._actions[more, self._pos[more]], more)
      if finished.any():
        out = np.flatnonzero(finished)
        done_ids = ids[out]
        discount = (self.gamma ** self._pos[done_ids]).astype(np.float32) if self.reward_type == "action" else None
        return StepBatch(obs={k: v[out] for k, v in b.obs.items()},
                         reward=self._reward[done_ids].astype(np.float32),
                         terminated=b.terminated[out], truncated=b.truncated[out],
                         success=self._success[done_ids].copy(), env_ids=done_ids, reset_step=b.reset_step[out],
                         discount=discount)

"""Host-side rollout buffer: preallocated [T, N] arrays a scheduler fills.

`store(t, obs, actions, version, result)` records the transition taken from
`obs` at step t; `result` is the StepBatch the env returned for it (all N envs,
ordered by env id). `rollout(last_values)` hands the learner a Rollout.
"""

from __future__ import annotations

import numpy as np

from ebrl.sampler import Actions
from ebrl.types import Rollout
from sim_adapters.base import EnvSpec, StepBatch


class RolloutBuffer:

  def __init__(self, spec: EnvSpec, num_steps: int, num_envs: int, action_size: int | None = None):
    """action_size: the policy's raw action width (default the env's; a flow policy's is wider)."""
    t, n = num_steps, num_envs
    self.obs = {k: np.zeros((t, n) + v.shape, v.dtype) for k, v in spec.obs.items()}
    self.actions = np.zeros((t, n, action_size or spec.action_dim), np.float32)
    self.logp = np.zeros((t, n), np.float32)
    self.values = np.zeros((t + 1, n), np.float32)
    self.rewards = np.zeros((t, n), np.float32)
    self.terminated = np.zeros((t, n), bool)
    self.done = np.zeros((t, n), bool)
    self.valid = np.zeros((t, n), bool)
    self.version = np.zeros((t, n), np.int32)
    self.discount: np.ndarray | None = None  # Allocated by the first row that carries one.

  def store(self, t: int, obs: dict[str, np.ndarray], actions: Actions, version: int, result: StepBatch,
            cols: slice = slice(None)) -> None:
    """Records step t for the envs in `cols` (all by default; a pipeline stage's slice)."""
    for k, v in obs.items():
      self.obs[k][t, cols] = v
    self.actions[t, cols] = actions.action
    self.logp[t, cols] = actions.logp
    self.values[t, cols] = actions.value
    self.version[t, cols] = version
    self.rewards[t, cols] = result.reward
    self.terminated[t, cols] = result.terminated
    self.done[t, cols] = result.done
    self.valid[t, cols] = ~result.reset_step
    if result.discount is not None:
      if self.discount is None:
        self.discount = np.ones(self.valid.shape, np.float32)
      self.discount[t, cols] = result.discount

  def rollout(self, last_values: np.ndarray) -> Rollout:
    self.values[-1] = last_values
    return Rollout(obs=self.obs, actions=self.actions, logp=self.logp, values=self.values,
                   rewards=self.rewards, terminated=self.terminated, done=self.done,
                   valid=self.valid, version=self.version, discount=self.discount)

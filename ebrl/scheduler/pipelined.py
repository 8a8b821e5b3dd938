"""The pipelined baseline (RLinf's disaggregated/hybrid mode, `pipeline_stage_num`).

Envs are split into S stages. Within a rollout the stages take turns: while
stage s's actions are generated, the other stages' envs are simulating (EnvPool
steps them on its own threads). Each stage still steps all its envs together,
a barrier ends the rollout, then the update runs and the params are synced, as
in the synchronous baseline.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ebrl.rollout import RolloutBuffer
from sim_adapters.envpool_adapter import gather_all


class PipelinedScheduler:

  def __init__(self, trainer):
    self.t = trainer

  def run(self, total_env_steps: int) -> None:
    t = self.t
    groups, sampler, clock = t.groups, t.sampler, t.clock
    horizon, n = t.cfg.rollout_length, groups.num_envs
    stages = range(len(groups))
    cols = [slice(int(o), int(o) + groups[s].num_envs) for s, o in enumerate(groups.offsets)]
    buf = RolloutBuffer(t.spec, horizon, n, t.action_size)
    obs = []
    for s in stages:
      with clock.stage("sim", lane=f"stage{s}"):
        groups[s].reset()
        first = gather_all(groups[s], groups[s].num_envs)
      t.tracker.observe(_global(first, groups.offsets[s]))
      obs.append(first.obs)
    while not t.should_stop(total_env_steps):
      pending = [None] * len(groups)
      # Prime the pipeline: every stage starts simulating its first step.
      for s in stages:
        pending[s] = self._generate_and_send(s, obs[s])
      for step in range(horizon):
        for s in stages:
          with clock.stage("sim", lane=f"stage{s}"):
            result = gather_all(groups[s], groups[s].num_envs)
          acts, version = pending[s]
          buf.store(step, obs[s], acts, version, result, cols[s])
          t.tracker.observe(_global(result, groups.offsets[s]))
          t.add_env_steps(groups[s].num_envs)
          obs[s] = result.obs
          if step + 1 < horizon:
            pending[s] = self._generate_and_send(s, obs[s])
      with clock.stage("gen", lane="sampler"):
        last_obs = {k: np.concatenate([o[k] for o in obs]) for k in obs[0]}
        last_values = sampler.value(last_obs)
      with clock.stage("train", lane="learner"):
        t.state, metrics = t.learner.update(t.state, buf.rollout(last_values))
        jax.block_until_ready(t.state)
      sampler.set_params(t.state.params, int(t.state.version))
      t.after_update(metrics)

  def _generate_and_send(self, s: int, obs):
    t = self.t
    group = t.groups[s]
    with t.clock.stage("gen", lane="sampler"):
      acts, version = t.sampler.act(obs)
    group.send(acts.env_action, np.arange(group.num_envs, dtype=np.int32))
    return acts, version


def _global(batch, offset):
  """A copy of the batch header with group-local env ids shifted to global ones."""
  return dataclasses.replace(batch, env_ids=batch.env_ids + offset)

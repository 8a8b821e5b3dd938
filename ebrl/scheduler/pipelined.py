"""The pipelined baseline (RLinf's disaggregated/hybrid mode, `pipeline_stage_num`).

Envs are split into S partitions (`pipelined.num_partitions` env groups). Within
a rollout the partitions take turns: while partition s's actions are
generated, the others' envs are simulating (EnvPool steps them on its own
threads). Each partition still steps all its envs together,
a barrier ends the rollout, then the update runs and the params are synced, as
in the synchronous baseline.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ebrl.trajectories.rollout_buffer import RolloutBuffer
from ebrl.scheduler.context import RunContext, Scheduler, UpdateReport, update_and_publish
from ebrl.types import TrainState
from sim_adapters.base import gather_all


class PipelinedScheduler(Scheduler):

  def __init__(self, ctx: RunContext):
    self.ctx = ctx

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report per update for as long as the caller takes them."""
    ctx = self.ctx
    groups, sampler, clock = ctx.host_envs, ctx.sampler, ctx.clock
    horizon, n = ctx.layout.rollout_length, ctx.layout.num_envs
    parts = range(len(groups))
    cols = [slice(int(o), int(o) + groups[s].num_envs) for s, o in enumerate(groups.offsets)]
    buf = RolloutBuffer(ctx.spec, horizon, n, ctx.action_size)
    obs = []
    for s in parts:
      with clock.stage("sim", lane=f"partition{s}"):
        groups[s].reset()
        first = gather_all(groups[s], groups[s].num_envs)
      ctx.tracker.observe(groups.to_global(s, first))
      obs.append(first.obs)
    while True:
      pending = [None] * len(groups)
      # Prime the pipeline: every partition starts simulating its first step.
      for s in parts:
        pending[s] = self._generate_and_send(s, obs[s])
      for step in range(horizon):
        for s in parts:
          with clock.stage("sim", lane=f"partition{s}"):
            result = gather_all(groups[s], groups[s].num_envs)
          acts, version = pending[s]
          buf.store(step, obs[s], acts, version, result, cols[s])
          ctx.tracker.observe(groups.to_global(s, result))
          ctx.tracker.count_steps(groups[s].num_envs)
          obs[s] = result.obs
          if step + 1 < horizon:
            pending[s] = self._generate_and_send(s, obs[s])
      with clock.stage("gen", lane="sampler"):
        last_obs = {k: np.concatenate([o[k] for o in obs]) for k in obs[0]}
        last_values = sampler.value(last_obs)
      report = update_and_publish(ctx, state, buf.rollout(last_values), lane="learner")
      state = report.state
      yield report

  def _generate_and_send(self, s: int, obs):
    group = self.ctx.host_envs[s]
    with self.ctx.clock.stage("gen", lane="sampler"):
      acts, version = self.ctx.sampler.act(obs)
    group.send(acts.env_action, np.arange(group.num_envs, dtype=np.int32))
    return acts, version

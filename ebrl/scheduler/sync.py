"""The synchronous baseline (RLinf's collocated mode), made as fast as it can be.

Each step: generate actions for all envs (barrier), step all envs (barrier).
After T steps: bootstrap values, one update (barrier), then the new params are
synced to the sampler. Nothing overlaps, so every second is spent in exactly
one stage; the StageClock says which.
"""

from __future__ import annotations

import jax

from ebrl.rollout import RolloutBuffer
from sim_adapters.envpool_adapter import gather_all


class SyncScheduler:

  def __init__(self, trainer):
    self.t = trainer

  def run(self, total_env_steps: int) -> None:
    t = self.t
    cfg, adapter, sampler, clock = t.cfg, t.adapter, t.sampler, t.clock
    n, horizon = cfg.num_envs, cfg.rollout_length
    buf = RolloutBuffer(t.spec, horizon, n, t.action_size)
    with clock.stage("sim"):
      adapter.reset()
      first = gather_all(adapter, n)
    t.tracker.observe(first)
    obs = first.obs
    while not t.should_stop(total_env_steps):
      for step in range(horizon):
        with clock.stage("gen"):
          acts, version = sampler.act(obs)
        with clock.stage("sim"):
          result = adapter.step(acts.env_action)
        buf.store(step, obs, acts, version, result)
        t.tracker.observe(result)
        t.add_env_steps(n)  # Per step: a success reached mid-rollout is dated there.
        obs = result.obs
      with clock.stage("gen"):
        last_values = sampler.value(obs)
      with clock.stage("train"):
        t.state, metrics = t.learner.update(t.state, buf.rollout(last_values))
        jax.block_until_ready(t.state)
      sampler.set_params(t.state.params, int(t.state.version))
      t.after_update(metrics)

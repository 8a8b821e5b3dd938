"""The synchronous baseline (RLinf's collocated mode), made as fast as it can be.

Each step: generate actions for all envs (barrier), step all envs (barrier).
After T steps: bootstrap values, one update (barrier), then the new params are
published to the sampler. Nothing overlaps, so every second is spent in exactly
one stage; the StageClock says which.
"""

from __future__ import annotations

from ebrl.acting import host_step
from ebrl.trajectories.rollout_buffer import RolloutBuffer
from ebrl.scheduler.context import RunContext, update_and_publish
from ebrl.types import TrainState
from sim_adapters.base import gather_all


class SyncScheduler:

  def __init__(self, ctx: RunContext):
    self.ctx = ctx

  def run(self, state: TrainState, total_env_steps: int) -> TrainState:
    ctx = self.ctx
    adapter, clock, log = ctx.host_envs[0], ctx.clock, ctx.log
    n, horizon = ctx.layout.num_envs, ctx.layout.rollout_length
    buf = RolloutBuffer(ctx.spec, horizon, n, ctx.action_size)
    with clock.stage("sim"):
      adapter.reset()
      first = gather_all(adapter, n)
    ctx.tracker.observe(first)
    obs = first.obs
    while not log.should_stop(total_env_steps):
      for step in range(horizon):
        acts, version, result = host_step(ctx.sampler, adapter, obs, clock)
        buf.store(step, obs, acts, version, result)
        ctx.tracker.observe(result)
        log.add_env_steps(n)  # Per step: a success reached mid-rollout is dated there.
        obs = result.obs
      with clock.stage("gen"):
        last_values = ctx.sampler.value(obs)
      state = update_and_publish(ctx, state, buf.rollout(last_values))
    return state

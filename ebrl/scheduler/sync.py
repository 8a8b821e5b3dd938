"""The synchronous baseline (RLinf's collocated mode), made as fast as it can be.

Each step: generate actions for all envs (barrier), step all envs (barrier).
After T steps: bootstrap values, one update (barrier), then the new params are
published to the sampler. Nothing overlaps, so every second is spent in exactly
one stage; the StageClock says which.
"""

from __future__ import annotations

from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from ebrl.acting import host_step
from ebrl.trajectories.rollout_buffer import RolloutBuffer
from ebrl.scheduler.context import RunContext, Scheduler, UpdateReport, update_and_publish
from ebrl.step_normalizer import StepNormalizer
from ebrl.types import TrainState
from sim_adapters.base import gather_all


class SyncScheduler(Scheduler):

  def __init__(self, ctx: RunContext):
    self.ctx = ctx

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report per update for as long as the caller takes them."""
    ctx = self.ctx
    adapter, clock = ctx.host_envs[0], ctx.clock
    n, horizon = ctx.layout.num_envs, ctx.layout.rollout_length
    buf = RolloutBuffer(ctx.spec, horizon, n, ctx.action_size)
    with clock.stage("sim"):
      adapter.reset()
      first = gather_all(adapter, n)
    ctx.tracker.observe(first)
    # obs_norm_update="every_step": observations are counted and normalised as they arrive.
    norm = None
    if ctx.learner.cfg.obs_norm_update == "every_step":
      norm = StepNormalizer(ctx.policy.input_keys, jax.tree.map(jnp.copy, state.params["obs_norm"]))

    def arrived(batch, counted):
      if norm is None:
        return batch.obs
      with clock.stage("gen"):  # Preparing the policy's inputs.
        return norm(batch.obs, counted)

    obs = arrived(first, np.ones(n, bool))
    while True:
      for step in range(horizon):
        acts, version, result = host_step(ctx.sampler, adapter, obs, clock)
        buf.store(step, obs, acts, version, result)
        ctx.tracker.observe(result)
        ctx.tracker.count_steps(n)  # Per step: a success reached mid-rollout is dated there.
        obs = arrived(result, ~result.done)  # An ended episode's final observation is not counted.
      with clock.stage("gen"):
        last_values = ctx.sampler.value(obs)
      if norm is not None:  # The update keeps them: evaluation and checkpoints see the last step's.
        # A copy: the update donates the state's buffers, the acting loop keeps its own.
        state = state.replace(params={**state.params, "obs_norm": jax.tree.map(jnp.copy, norm.stats)})
      report = update_and_publish(ctx, state, buf.rollout(last_values))
      state = report.state
      yield report

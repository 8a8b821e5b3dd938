"""Random actions, no policy and no learning: the simulator's own speed.

Benchmarks run it beside the real schedulers on the same adapter and cores, so
`sync_over_random` says how much of the simulator's speed a scheduler keeps.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ebrl.scheduler.context import RunContext, Scheduler, UpdateReport, report
from ebrl.types import TrainState
from sim_adapters.base import gather_all


class RandomScheduler(Scheduler):
  learns = False

  def __init__(self, ctx: RunContext):
    self.ctx = ctx

  def run(self, state: TrainState) -> Iterator[UpdateReport]:
    """Yields a report (no update: the same state, no metrics) per rollout for as long as the caller
    takes them."""
    ctx = self.ctx
    adapter, clock, spec = ctx.host_envs[0], ctx.clock, ctx.spec
    n = ctx.layout.num_envs
    rng = np.random.default_rng(ctx.env_seed)
    with clock.stage("sim"):
      adapter.reset()
      ctx.tracker.observe(gather_all(adapter, n))
    while True:
      for _ in range(ctx.layout.rollout_length):
        actions = rng.uniform(spec.action_low, spec.action_high, (n, spec.action_dim)).astype(np.float32)
        with clock.stage("sim"):
          result = adapter.step(actions)
        ctx.tracker.observe(result)
      ctx.tracker.count_steps(n * ctx.layout.rollout_length)
      yield report(ctx, state, {})

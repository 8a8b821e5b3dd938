"""Random actions, no policy and no learning: the simulator's own speed.

Benchmarks run it beside the real schedulers on the same adapter and cores, so
`sync_over_random` says how much of the simulator's speed a scheduler keeps.
"""

from __future__ import annotations

import numpy as np

from sim_adapters.envpool_adapter import gather_all


class RandomScheduler:

  def __init__(self, trainer):
    self.t = trainer

  def run(self, total_env_steps: int) -> None:
    t = self.t
    adapter, clock, spec, n = t.adapter, t.clock, t.spec, t.cfg.num_envs
    rng = np.random.default_rng(t.env_seed)
    with clock.stage("sim"):
      adapter.reset()
      t.tracker.observe(gather_all(adapter, n))
    while not t.should_stop(total_env_steps):
      for _ in range(t.cfg.rollout_length):
        actions = rng.uniform(spec.action_low, spec.action_high, (n, spec.action_dim)).astype(np.float32)
        with clock.stage("sim"):
          result = adapter.step(actions)
        t.tracker.observe(result)
      t.add_env_steps(n * t.cfg.rollout_length)
      t.after_update({})

"""How much each update consumes, and so how many updates a run's budget pays for.

Why one place: the learning-rate schedule decays over the run's updates and the
run stops after the last of them, so both must count updates as the scheduler
really makes them. sync and pipelined (and the fused device rollout) update on
every env's rollout_length steps; the ebrl schedulers on
`ebrl.segments_per_update` segments of rollout_length steps.
"""

from __future__ import annotations

import math


def segments_per_update(cfg) -> int:
  """Env segments of rollout_length steps in one update."""
  if cfg.scheduler == "ebrl":
    return cfg.ebrl.segments_per_update or cfg.num_envs
  return cfg.num_envs


def samples_per_update(cfg) -> int:
  return segments_per_update(cfg) * cfg.rollout_length


def total_updates(cfg, total_env_steps: int) -> int:
  """Updates a budget of total_env_steps pays for (at least one)."""
  return max(1, math.ceil(total_env_steps / samples_per_update(cfg)))

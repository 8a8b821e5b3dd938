"""The tiny run config tests build runs from.

Every test that trains a run starts from these shapes (4 envs, 8-step rollouts,
a 16x16 MLP, one epoch of two minibatches), so its programs are the ones the
tests before it compiled: JAX's persistent cache (tests/conftest.py) serves
them to each later test and to the processes tests start.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from launch.configs import default


def tiny_config(total: int = 128, *, scheduler: str = "sync", resume: bool = False,
                **overrides: Any) -> ml_collections.ConfigDict:
  """The default config at tiny shapes, `total` env steps, no checkpoint before the last;
  `overrides` by dotted key with "__" for ".", e.g. `algorithm__epochs=2`."""
  cfg = default.get_config()
  cfg.num_envs = 4
  cfg.rollout_length = 8
  cfg.total_env_steps = total
  cfg.scheduler = scheduler
  cfg.policy.hidden = (16, 16)
  cfg.algorithm.epochs = 1
  cfg.algorithm.num_minibatches = 2
  cfg.checkpoint_every_s = 1e9
  cfg.resume = resume
  for key, value in overrides.items():
    *path, leaf = key.split("__")
    section = cfg
    for name in path:
      section = section[name]
    if leaf not in section:
      raise KeyError(f"tiny_config: no config key {key.replace('__', '.')}")
    section[leaf] = value
  return cfg

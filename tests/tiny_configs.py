"""The tiny run config tests build runs from, and the few steps every such test takes.

Every test that trains a run starts from these shapes (4 envs, 8-step rollouts,
a 16x16 MLP, one epoch of two minibatches), so its programs are the ones the
tests before it compiled: JAX's persistent cache (tests/conftest.py) serves
them to each later test and to the processes tests start.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

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


def run_to_end(cfg: ml_collections.ConfigDict, workdir) -> tuple[Any, dict[str, Any]]:
  """Builds the Trainer for `cfg` in `workdir`, trains it over its whole budget and finishes it:
  the trainer (its state and stages stay readable) and the run's summary."""
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top  (the training stack, only when a run is built)

  trainer = Trainer(cfg, str(workdir), progress=False)
  trainer.train()
  return trainer, trainer.finish()


def leaves(tree) -> list[np.ndarray]:
  """A pytree's leaves as host arrays, in tree order, to compare two states leaf by leaf."""
  return [np.asarray(x) for x in jax.tree.leaves(tree)]

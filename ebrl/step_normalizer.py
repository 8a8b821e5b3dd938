"""Observation statistics that take every env step as it arrives (VecNormalize's timing).

Why: with `algorithm.obs_norm_update="every_step"` the run normalises observations the way
Stable-Baselines3's VecNormalize does, so that EBRL's PPO can be run as that PPO, step for step.
Each batch of observations an env step returns is merged into the running statistics first and
then normalised with them (clipped to +-10); the final observation of an ended episode (EnvPool
returns it before the reset row) is normalised but not counted, as VecNormalize never counts a
terminal observation. The policy then acts on the normalised inputs, the rollout stores them, and
the learner trains on exactly what was acted on (`ebrl/learner.py`); the statistics after the
rollout go into the params, so evaluation and checkpoints normalise as the last step did.

Only for policies whose normalised inputs are their flat observation vectors (`input_keys`, each
[..., d]: the mlp); the inputs are split back into their keys after normalising.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ebrl import normalizer
from policies.base import vector_inputs


def identity_stats(dim: int) -> normalizer.RunningStats:
  """Statistics under which `normalizer.normalize` returns its (already clipped) input unchanged:
  mean 0 and a variance that rounds, with the 1e-8 added, to exactly 1 in float32."""
  return normalizer.RunningStats(jnp.zeros(dim, jnp.float32), jnp.full(dim, 1.0 - 1e-8, jnp.float32),
                                 jnp.zeros((), jnp.float32))


class StepNormalizer:
  """Running observation statistics the acting loop updates at every env step."""

  def __init__(self, keys: tuple[str, ...], stats: normalizer.RunningStats):
    self.keys = tuple(keys)
    self.stats = stats

    def merge_and_normalize(stats, obs, counted):
      x = vector_inputs(obs, self.keys)
      stats = normalizer.update_stats(stats, x, counted)
      z = normalizer.normalize(stats, x)
      sizes = np.cumsum([obs[k].shape[-1] for k in self.keys])[:-1]
      return stats, dict(zip(self.keys, jnp.split(z, sizes, axis=-1)))

    self._step = jax.jit(merge_and_normalize)

  def __call__(self, obs: dict[str, np.ndarray], counted: np.ndarray) -> dict[str, np.ndarray]:
    """Merges the rows of `obs` where `counted` into the statistics, then returns every row
    normalised with them (the other keys of obs are passed through)."""
    self.stats, z = self._step(self.stats, {k: obs[k] for k in self.keys}, jnp.asarray(counted, jnp.float32))
    return {**obs, **{k: np.asarray(v) for k, v in z.items()}}

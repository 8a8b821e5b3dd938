"""The one unbatched env a DeviceSim batches, whichever library it came from.

Playground and Brax share a shape (`reset(key) -> state`, `step(state, a) ->
state` with `.obs`, `.reward`, `.done`), but not the details the DeviceSim
needs: observation layout, episode limit, success. A CoreEnv states those
explicitly, so device_sim.py never asks which library an env came from (and
never imports one: backends.py does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class CoreEnv:
  """One unbatched env and what a DeviceSim must know about it."""

  name: str
  reset: Callable[[jax.Array], Any]
  step: Callable[[Any, jax.Array], Any]
  obs_shapes: dict[str, tuple[int, ...]]
  action_size: int
  episode_length: int
  success: Callable[[Any], jax.Array] | None  # state -> bool scalar; None: no success signal
  raw: Any  # The library's env object (for tests and evaluation).

  def obs(self, state) -> dict[str, jax.Array]:
    """The env's observation as a dict of float32 arrays (`state` always present)."""
    o = state.obs
    if not isinstance(o, dict):
      o = {"state": o}
    return {k: jnp.asarray(o[k], jnp.float32) for k in self.obs_shapes}


def action_bounds(core: CoreEnv) -> tuple[np.ndarray, np.ndarray]:
  """Playground and Brax both take actions in [-1, 1] and scale them inside."""
  return -np.ones(core.action_size, np.float32), np.ones(core.action_size, np.float32)

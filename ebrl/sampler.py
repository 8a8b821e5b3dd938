"""Batched action generation from the run's ParamStore.

The sampler reads the newest (params, version) from the store at every call
and keeps one jitted `act`; any batch size of ready envs can be served (each
new size compiles once). The PRNG key of a call
is derived inside the jit from a base key and a call counter, so a call costs a
single dispatch. Actions come back raw (for the log-prob) and clipped to the
env's bounds (for the simulator). With a generation mesh (config.devices.gen),
each batch is split along its env axis over the mesh's devices (padded to a
multiple of them) and the params are those the store placed there.

actions="mean" acts deterministically with the policy's `mean_action` (evaluation's mean
mode): the same actions for the same observations, whatever the key. The logp and value it
returns are zeros (nothing learns from such steps; `value` still reads the critic).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ebrl.param_store import ParamStore
from ebrl.step_normalizer import identity_stats
from policies.base import MeanActing, Policy, action_size, state_value
from sim_adapters.base import EnvSpec

ACTION_MODES = ("sample", "mean")  # How a Sampler acts: policy.sample, or policy.mean_action.


class Actions(NamedTuple):
  action: np.ndarray  # [B, action_size] raw policy sample (what logp is of), or its mean action
  env_action: np.ndarray  # [B, A] clipped to the env's action bounds
  logp: np.ndarray  # [B] (zeros with actions="mean")
  value: np.ndarray  # [B] (zeros with actions="mean")


class Sampler:

  def __init__(self, policy: Policy, spec: EnvSpec, params: ParamStore, seed: int = 0, mesh: Mesh | None = None,
               prenormalized: bool = False, actions: str = "sample"):
    """prenormalized: the observations come normalised already (ebrl/step_normalizer.py), so the
    policy acts on them with identity statistics instead of the params' own. actions: "sample"
    (training's) or "mean" (`policy.mean_action`; logp and value zeros)."""
    if actions not in ACTION_MODES:
      raise ValueError(f"actions='{actions}' must be one of: {', '.join(ACTION_MODES)}")
    self.policy = policy
    self.actions = actions
    acting = MeanActing(policy) if actions == "mean" else policy
    self.params = params
    self._batch_sharding = None if mesh is None else NamedSharding(mesh, P(mesh.axis_names[0]))
    self._devices = 1 if mesh is None else mesh.devices.size
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)

    a = spec.action_dim
    as_given = (lambda params: {**params, "obs_norm": identity_stats(params["obs_norm"].mean.shape[-1])}) \
        if prenormalized else (lambda params: params)

    def act(params, obs, key, counter):
      params = as_given(params)
      # The env gets the first action_dim entries (a flow policy's raw action also carries its chain).
      action, logp, value, _ = acting.sample(params, obs, jax.random.fold_in(key, counter))
      return action, jnp.clip(action[..., :a], low, high), logp, value

    self._act = jax.jit(act)
    width = action_size(policy, spec)
    self._value = jax.jit(lambda params, obs: state_value(policy, as_given(params), obs, width))
    self._key = jax.random.key(seed)
    self._counter = 0
    self._lock = threading.Lock()  # Guards the call counter (the key sequence).

  def act(self, obs: dict[str, np.ndarray], pad: bool = False) -> tuple[Actions, int]:
    """Returns the actions for obs and the version of the params that made them.

    pad=True rounds the batch up to a power of two, so batches of ready envs of
    any size share a few compiled shapes.
    """
    params, version = self.params.latest()
    with self._lock:
      self._counter += 1
      counter = self._counter
    n = next(iter(obs.values())).shape[0]
    size = 1 << max(0, (n - 1).bit_length()) if pad else n
    size = -(-size // self._devices) * self._devices  # Every generation device gets equal rows.
    if size != n:
      obs = {k: np.concatenate([v, np.zeros((size - n,) + v.shape[1:], v.dtype)]) for k, v in obs.items()}
    if self._batch_sharding is not None:
      obs = jax.device_put(obs, self._batch_sharding)
    out = self._act(params, obs, self._key, counter)
    return Actions(*(np.asarray(x)[:n] for x in out)), version

  @property
  def calls(self) -> int:
    return self._counter

  def take_call(self) -> int:
    """Numbers a call made elsewhere (a device collect draws its key from it), so every key of a
    run, resumed or not, comes from one sequence."""
    with self._lock:
      self._counter += 1
      return self._counter - 1

  def restore_counter(self, calls: int) -> None:
    """Continues the key sequence of an earlier run (resume)."""
    self._counter = calls

  def value(self, obs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(self._value(self.params.latest()[0], obs))

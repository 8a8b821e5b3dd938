"""The Policy contract (docs/ARCHITECTURE.md, Contracts).

A policy is pure functions over explicit params so the sampler and the learner
can jit them separately and exchange params by version:
`sample(params, obs, key) -> (action, logp, value, extras)`,
`evaluate(params, obs, action) -> (logp, entropy, value)` and
`mean_action(params, obs) -> action`, the deterministic action evaluation acts with.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from sim_adapters.base import EnvSpec

Params = Any
Obs = dict[str, jax.Array]


class IncompatibleObservationError(ValueError):
  """The policy cannot read the env's observations."""


class Policy(Protocol):
  name: str

  def init(self, key: jax.Array) -> Params:
    ...

  def sample(self, params: Params, obs: Obs, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, dict]:
    ...

  def evaluate(self, params: Params, obs: Obs, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    ...

  def mean_action(self, params: Params, obs: Obs) -> jax.Array:
    """The policy's deterministic action, raw [B, action_size] as `sample`'s (the env gets the first
    action_dim entries): a Gaussian's mean, a token policy's most likely tokens (greedy decoding), a
    flow policy's noise-free chain. Evaluation with actions="mean" acts with it."""
    ...

  def update_normalizer(self, params: Params, obs: Obs, weight: jax.Array) -> Params:
    ...


VECTOR_KEYS = ("state", "task")  # Flat observation inputs, read in this order when present.


def vector_keys(spec: EnvSpec) -> tuple[str, ...]:
  """The flat inputs (state, a multi-task env's task one-hot) this env gives, in reading order."""
  return tuple(k for k in VECTOR_KEYS if k in spec.obs)


def vector_dim(spec: EnvSpec) -> int:
  return sum(int(np.prod(spec.obs[k].shape)) for k in vector_keys(spec))


def vector_inputs(obs: Obs, keys: tuple[str, ...]) -> jax.Array:
  """The flat inputs concatenated as float32 along the last axis (any leading batch axes)."""
  return jnp.concatenate([obs[k].astype(jnp.float32) for k in keys], axis=-1)


class FlatInputs:
  """`input_keys` and `input_dim` of the flat inputs, for policies holding a `spec`."""

  @property
  def input_keys(self) -> tuple[str, ...]:
    return vector_keys(self.spec)  # type: ignore[attr-defined]

  @property
  def input_dim(self) -> int:
    return vector_dim(self.spec)  # type: ignore[attr-defined]


def action_size(policy, spec: EnvSpec) -> int:
  """Width of the policy's raw action: the env's action_dim, or more when the policy keeps what its
  log-prob needs beside the action (a flow policy's denoising chain). The env gets the first
  spec.action_dim entries."""
  return int(getattr(policy, "action_size", spec.action_dim))


def state_value(policy, params: Params, obs: Obs, width: int) -> jax.Array:
  """V(obs) from the policy's critic: `evaluate` at a placeholder action of `width` (the value
  does not depend on it). The sampler's bootstrap values and the device rollout's use this."""
  n = next(iter(obs.values())).shape[0]
  return policy.evaluate(params, obs, jnp.zeros((n, width)))[2]


class MeanActing:
  """`policy` acting with its mean action: `sample` returns `policy.mean_action` (the key unused),
  with zero log-probs and zero values (nothing learns from these steps; the critic is still
  `evaluate`'s, delegated like every other attribute). Evaluation with actions="mean" acts through
  it on host (the Sampler) and device (the shared unroll) envs alike."""

  def __init__(self, policy):
    self.policy = policy

  def __getattr__(self, name: str):  # Only for names the wrapper lacks.
    if name == "policy":
      raise AttributeError(name)
    return getattr(self.policy, name)

  def sample(self, params: Params, obs: Obs, key: jax.Array):
    del key
    action = self.policy.mean_action(params, obs)
    zeros = jnp.zeros(action.shape[:-1], jnp.float32)
    return action, zeros, zeros, {}


def check_chunk(spec: EnvSpec, chunk_size: int) -> None:
  """ValueError unless chunks of `chunk_size` actions tile the env's action_dim as the env runs them."""
  if chunk_size < 1 or spec.action_dim % chunk_size:
    raise ValueError(f"chunk_size={chunk_size} must divide the env's action_dim {spec.action_dim}")
  if spec.chunk_size != 1 and spec.chunk_size != chunk_size:
    raise ValueError(f"chunk_size={chunk_size} but env '{spec.name}' executes chunks of {spec.chunk_size}")


def check_instructions(policy_name: str, spec: EnvSpec, instructions) -> None:
  """One instruction per task id (the "task" one-hot), or one for a single-task env."""
  n = spec.obs["task"].shape[0] if "task" in spec.obs else 1
  if len(instructions) != n:
    raise IncompatibleObservationError(
        f"policy '{policy_name}' got {len(instructions)} instructions for {n} tasks of env '{spec.name}' "
        f"({'task one-hot' if 'task' in spec.obs else 'no task key'})")


# How a run gets an observation key it lacks: the config flags that add it.
_HOW_TO_GET = {
    "pixels": "add --config.env.from_pixels=True (with --config.env.render_stage=True to keep the state)",
    "state": "add --config.env.render_stage=True to draw the pixels beside the state "
             "(env.from_pixels=True alone gives pixels only)",
}


def check_compatible(policy_name: str, needs: tuple[str, ...], spec: EnvSpec) -> None:
  """Raises IncompatibleObservationError when the env lacks a key the policy reads.

  The message names the flags that give the missing key, so a user need not
  know which env options produce which observations.
  """
  missing = [k for k in needs if k not in spec.obs]
  if missing:
    gives = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in spec.obs.items())
    hints = "; ".join(_HOW_TO_GET[k] for k in missing if k in _HOW_TO_GET)
    raise IncompatibleObservationError(
        f"policy '{policy_name}' needs observation key(s) {missing} but env '{spec.name}' gives {gives}"
        + (f"; {hints}" if hints else ""))


def key_name(k) -> str:
  """A pytree path entry's name (dict key, attribute name or sequence index)."""
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


# Names of the modules that hold a policy's critic: the value torso of mlp, cnn and flow, the value
# head of vla. Everything else under params["net"] (encoders shared with the actor included) acts.
CRITIC_MODULES = ("critic", "value_head")


def is_critic_path(names) -> bool:
  """Whether a leaf whose path has these entry names belongs to the critic."""
  return any(name in CRITIC_MODULES for name in names)


def critic_mask(net: Params) -> Params:
  """A tree like params["net"] of bools: True on the critic's leaves. A critic warm-up trains only
  these, so the acting policy (and whatever the critic shares with it) stays bit-identical."""
  return jax.tree_util.tree_map_with_path(lambda path, _: is_critic_path(key_name(k) for k in path), net)

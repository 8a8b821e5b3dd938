"""Gaussian actor-critic MLP on flat state (plus the task one-hot for multi-task envs).

Actor and critic are separate tanh MLPs with orthogonal initialisation (the
settings that make PPO on MuJoCo reliable); the action std is a learned,
state-independent parameter, optionally bounded (`min_std`, `max_std`: log_std is
clipped to [log min_std, log max_std] in the forward pass, so a fine-tuned policy's
exploration neither collapses nor blows up; 0 leaves that side unbounded). Actions
are unbounded Gaussian samples; the sampler clips them to the env's bounds, and
log-probs are of the raw sample. `mean_action` is the Gaussian's mean.
Observation statistics live in params["obs_norm"] (see ebrl/normalizer.py).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ebrl import normalizer
from policies.base import FlatInputs, Obs, Params, check_compatible, vector_inputs
from sim_adapters.base import EnvSpec

_LOG_2PI = float(np.log(2 * np.pi))


class _Torso(nn.Module):
  hidden: Sequence[int]
  out: int
  out_scale: float

  @nn.compact
  def __call__(self, x):
    for h in self.hidden:
      x = nn.tanh(nn.Dense(h, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
    return nn.Dense(self.out, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class _ActorCritic(nn.Module):
  action_dim: int
  hidden: Sequence[int]
  init_log_std: float

  @nn.compact
  def __call__(self, x):
    mean = _Torso(self.hidden, self.action_dim, 0.01, name="actor")(x)
    value = _Torso(self.hidden, 1, 1.0, name="critic")(x)[..., 0]
    log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))
    return mean, log_std, value


def gaussian_logp(action: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
  z = (action - mean) * jnp.exp(-log_std)
  return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * _LOG_2PI, axis=-1)


def gaussian_entropy(log_std: jax.Array, batch_shape: tuple[int, ...]) -> jax.Array:
  return jnp.broadcast_to(jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI)), batch_shape)


def bound_log_std(log_std: jax.Array, min_std: float, max_std: float) -> jax.Array:
  """log_std clipped to [log min_std, log max_std]; a bound of 0 (or less) is none."""
  lo = float(np.log(min_std)) if min_std > 0 else None
  hi = float(np.log(max_std)) if max_std > 0 else None
  return log_std if lo is None and hi is None else jnp.clip(log_std, lo, hi)


class GaussianActing:
  """sample / evaluate / mean_action of a policy whose `_forward(params, obs)` gives (mean, log_std, value)."""

  def mean_action(self, params: Params, obs: Obs) -> jax.Array:
    """The Gaussian's mean: the deterministic action (evaluation with actions="mean")."""
    return self._forward(params, obs)[0]

  def sample(self, params: Params, obs: Obs, key: jax.Array):
    mean, log_std, value = self._forward(params, obs)
    action = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    return action, gaussian_logp(action, mean, log_std), value, {}

  def evaluate(self, params: Params, obs: Obs, action: jax.Array):
    mean, log_std, value = self._forward(params, obs)
    return gaussian_logp(action, mean, log_std), gaussian_entropy(log_std, value.shape), value


@dataclasses.dataclass(frozen=True)
class MLPPolicy(FlatInputs, GaussianActing):
  spec: EnvSpec
  hidden: tuple[int, ...] = (64, 64)
  init_log_std: float = -0.5
  min_std: float = 0.0  # Bounds of the action std (0: none); see the module docstring.
  max_std: float = 0.0
  name: str = "mlp"

  def __post_init__(self):
    check_compatible(self.name, ("state",), self.spec)

  @property
  def _net(self) -> _ActorCritic:
    return _ActorCritic(self.spec.action_dim, tuple(self.hidden), self.init_log_std)

  def _inputs(self, obs: Obs) -> jax.Array:
    return vector_inputs(obs, self.input_keys)

  def init(self, key: jax.Array) -> Params:
    net = self._net.init(key, jnp.zeros((1, self.input_dim), jnp.float32))["params"]
    return {"net": net, "obs_norm": normalizer.init_stats(self.input_dim)}

  def _forward(self, params: Params, obs: Obs):
    x = normalizer.normalize(params["obs_norm"], self._inputs(obs))
    mean, log_std, value = self._net.apply({"params": params["net"]}, x)
    return mean, bound_log_std(log_std, self.min_std, self.max_std), value

  def update_normalizer(self, params: Params, obs: Obs, weight: jax.Array) -> Params:
    stats = normalizer.update_stats(params["obs_norm"], self._inputs(obs), weight)
    return {**params, "obs_norm": stats}

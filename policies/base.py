"""The Policy contract (DESIGN.md, Interfaces).

A policy is pure functions over explicit params so the sampler and the learner
can jit them separately and exchange params by version:
`sample(params, obs, key) -> (action, logp, value, extras)` and
`evaluate(params, obs, action) -> (logp, entropy, value)`.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

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

  def update_normalizer(self, params: Params, obs: Obs, weight: jax.Array) -> Params:
    ...


def action_size(policy, spec: EnvSpec) -> int:
  """Width of the policy's raw action: the env's action_dim, or more when the policy keeps what its
  log-prob needs beside the action (a flow policy's denoising chain). The env gets the first
  spec.action_dim entries."""
  return int(getattr(policy, "action_size", spec.action_dim))


def check_compatible(policy_name: str, needs: tuple[str, ...], spec: EnvSpec) -> None:
  """Raises IncompatibleObservationError when the env lacks a key the policy reads."""
  missing = [k for k in needs if k not in spec.obs]
  if missing:
    gives = ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in spec.obs.items())
    raise IncompatibleObservationError(
        f"policy '{policy_name}' needs observation key(s) {missing} but env '{spec.name}' gives {gives}")

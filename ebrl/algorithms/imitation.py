"""Supervised losses, one per policy family, on expert action chunks.

Why one loss per family rather than `-evaluate(...)` for all: each policy is trained
on what it actually predicts. A Gaussian policy's log-likelihood is its own
objective; a VLA predicts discretised tokens, so cross-entropy on the expert's
tokens (teacher forcing, which is what `evaluate` does for autoregressive
decoding too); a flow policy's log-likelihood is that of its noisy sampling
chain, which a demo does not have, so it regresses its velocity field (conditional
flow matching).

Every loss takes `actions` [B, K*A], the K consecutive expert actions from each
step (K = the policy's chunk size), and `mask` [B, K*A], 0 where an episode ended
before the chunk did (the env drops those actions, so they are not targets).
All are pure and jit-able; `key` is used by flow matching only.
"""

from __future__ import annotations

from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np


Params = Any
Obs = dict[str, jax.Array]
_HALF_LOG_2PI = 0.5 * float(np.log(2 * np.pi))
LossFn = Callable[[Params, Obs, jax.Array, jax.Array, jax.Array], jax.Array]


def gaussian_nll(policy, params: Params, obs: Obs, actions: jax.Array, mask: jax.Array, key=None) -> jax.Array:
  """mlp, cnn: mean over rows of the negative log-likelihood summed over the valid action dims."""
  del key
  mean, log_std, _ = policy._forward(params, obs)  # pylint: disable=protected-access
  chex.assert_equal_shape([mean, actions, mask])
  z = (actions - mean) * jnp.exp(-log_std)
  per_dim = -0.5 * jnp.square(z) - log_std - _HALF_LOG_2PI  # The policy's gaussian_logp before its sum.
  return -jnp.sum(per_dim * mask) / actions.shape[0]


def expert_tokens(policy, actions: jax.Array) -> jax.Array:
  """vla: the expert's action tokens [B, K*A] (the bins the policy's tokenizer puts them in)."""
  return policy.action_tokenizer.to_tokens(actions)


def token_cross_entropy(policy, params: Params, obs: Obs, actions: jax.Array, mask: jax.Array,
                        key=None) -> jax.Array:
  """vla: mean cross-entropy (nats per valid token) of the expert's tokens; the tokens are also the
  teacher-forced inputs, so parallel and autoregressive decoding are both trained as they score."""
  del key
  tokens = expert_tokens(policy, actions)
  logp_all, _ = policy.token_logits(params, obs, tokens)
  chex.assert_shape(logp_all, tokens.shape + (policy.bins,))
  nll = -jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def flow_noise(key: jax.Array, batch: int, dim: int) -> tuple[jax.Array, jax.Array]:
  """The flow-matching draws: x_0 ~ N(0, I) [B, D] and t ~ U(0, 1) [B]."""
  k0, kt = jax.random.split(key)
  return jax.random.normal(k0, (batch, dim)), jax.random.uniform(kt, (batch,))


def flow_matching(policy, params: Params, obs: Obs, actions: jax.Array, mask: jax.Array,
                  key: jax.Array) -> jax.Array:
  """flow: mean over valid dims of ||v(x_t, t | obs) - (x_1 - x_0)||^2, x_1 the expert chunk in chain
  units, x_t = (1 - t) x_0 + t x_1 (the policy's Euler chain integrates v from t = 0 to 1)."""
  obs_x = policy.normalized_obs(params, obs)
  b, d = actions.shape
  center, half = policy._affine  # pylint: disable=protected-access
  x1 = (actions.astype(jnp.float32) - center) / half
  x0, t = flow_noise(key, b, d)
  xt = (1 - t[:, None]) * x0 + t[:, None] * x1
  v = policy.velocity(params, obs_x, xt, t)
  chex.assert_equal_shape([v, x1, mask])
  return jnp.sum(jnp.square(v - (x1 - x0)) * mask) / jnp.maximum(jnp.sum(mask), 1.0)


LOSSES = {"mlp": gaussian_nll, "cnn": gaussian_nll, "vla": token_cross_entropy, "flow": flow_matching}
LOSS_NAMES = {"mlp": "gaussian_nll", "cnn": "gaussian_nll", "vla": "token_cross_entropy",
              "flow": "flow_matching"}


def loss_for(policy) -> LossFn:
  """The supervised loss of `policy`'s family, as f(params, obs, actions, mask, key)."""
  if policy.name not in LOSSES:
    raise ValueError(f"no supervised loss for policy '{policy.name}'; valid: {', '.join(LOSSES)}")
  fn = LOSSES[policy.name]
  return lambda params, obs, actions, mask, key: fn(policy, params, obs, actions, mask, key)

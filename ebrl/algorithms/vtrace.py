"""V-trace (IMPALA, Espeholt et al. 2018) over a [T, N] segment batch.

The ebrl scheduler's alternative to decoupled PPO for stale samples: value
targets and policy-gradient advantages are corrected with truncated importance
weights rho_t = min(rho_clip, pi/mu) and c_t = lambda * min(c_clip, pi/mu),
where pi is the policy being updated (the params at the start of the update)
and mu the policy that acted.

  delta_t = rho_t * (r_t + gamma * (1 - term_t) * V(x_{t+1}) - V(x_t))
  vs_t    = V(x_t) + delta_t + gamma * c_t * (1 - cut_t) * (vs_{t+1} - V(x_{t+1}))
  adv_t   = rho_t * (r_t + gamma * (1 - term_t) * next_t - V(x_t)),
            next_t = V(x_{t+1}) if cut_t else vs_{t+1}

Rows follow ebrl/algorithms/gae.py: `values` has T + 1 rows, a terminated step
bootstraps nothing, a truncated one bootstraps from the value of its final
observation, and `cut` (episode end or an invalid next sample) stops the
correction flowing back. With pi = mu, rho_clip >= 1 and c_clip >= 1 the value
targets are exactly GAE(lambda)'s returns.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def vtrace(rewards: jax.Array, values: jax.Array, terminated: jax.Array, cut: jax.Array,
           log_rho: jax.Array, gamma: float | jax.Array, lam: float, rho_clip: float = 1.0,
           c_clip: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """Returns (policy-gradient advantages [T, N], value targets vs [T, N]); gamma: one or per row."""
  chex.assert_rank([rewards, values, log_rho], 2)
  chex.assert_equal_shape([rewards, terminated, cut, log_rho])
  chex.assert_axis_dimension(values, 0, rewards.shape[0] + 1)
  gamma = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32), rewards.shape)
  ratio = jnp.exp(log_rho)
  rho = jnp.minimum(rho_clip, ratio)
  c = lam * jnp.minimum(c_clip, ratio)
  not_term = 1.0 - terminated.astype(jnp.float32)
  not_cut = 1.0 - cut.astype(jnp.float32)
  deltas = rho * (rewards + gamma * not_term * values[1:] - values[:-1])

  def backward(acc, xs):  # acc = vs_{t+1} - V(x_{t+1})
    delta, ct, nc, g = xs
    acc = delta + g * ct * nc * acc
    return acc, acc

  _, vs_minus_v = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, c, not_cut, gamma), reverse=True)
  vs = values[:-1] + vs_minus_v
  vs_next = jnp.concatenate([vs[1:], values[-1:]])
  next_value = jnp.where(cut, values[1:], vs_next)
  adv = rho * (rewards + gamma * not_term * next_value - values[:-1])
  return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(vs)

"""Generalised advantage estimation over a [T, N] rollout.

Row t is the transition (obs_t, action_t) -> reward[t], terminated[t], done[t].
`values` has T + 1 rows: values[T] bootstraps the last step. A terminated step
bootstraps nothing; a truncated one (done but not terminated) bootstraps from
values[t + 1], which is the value of the episode's final observation because
the env only resets on the step after (see sim_adapters/envpool_adapter.py).
`done` stops the advantage flowing back across an episode boundary. `gamma`
is one discount or one per row ([T, N]: an action chunk cut short is fewer
actions away from its next state).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def gae(rewards: jax.Array, values: jax.Array, terminated: jax.Array, done: jax.Array,
        gamma: float | jax.Array, lam: float) -> tuple[jax.Array, jax.Array]:
  """Returns (advantages [T, N], value targets [T, N])."""
  chex.assert_rank([rewards, values], 2)
  chex.assert_equal_shape([rewards, terminated, done])
  chex.assert_axis_dimension(values, 0, rewards.shape[0] + 1)
  gamma = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32), rewards.shape)
  not_term = 1.0 - terminated.astype(jnp.float32)
  not_done = 1.0 - done.astype(jnp.float32)
  deltas = rewards + gamma * not_term * values[1:] - values[:-1]

  def backward(carry, xs):
    delta, nd, g = xs
    adv = delta + g * lam * nd * carry
    return adv, adv

  _, adv = jax.lax.scan(backward, jnp.zeros_like(values[0]), (deltas, not_done, gamma), reverse=True)
  return adv, adv + values[:-1]

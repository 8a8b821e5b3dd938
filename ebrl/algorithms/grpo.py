"""GRPO: critic-free, group-relative advantages over a [T, N] rollout.

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath) drops the
critic: the baseline of a sample is the mean outcome of a group of samples
drawn from the same starting point, and the advantage is the outcome
normalised within its group, (G - mean_group) / (std_group + eps).

Here a group is `group_size` consecutive envs (env i is in group
i // group_size) that start every episode from the same initial state: they
share an EnvPool `env_seed` (see `grouped_env_seeds`), so their resets draw the
same goals and object poses. Envs of a group at the same time index of the
rollout are then in the same situation up to what their policies did since the
reset, and the group mean of their returns is the baseline that a critic would
otherwise estimate. When the env executes action chunks one transition is one
chunk, so the comparison is chunk-level.

The outcome G of row t is the discounted return-to-go inside the rollout
window and inside its episode: G_t = r_t + gamma * (1 - done_t) * G_{t+1},
G_T = 0. There is no bootstrap (no critic), so an episode cut by the end of the
window contributes only the rewards the window saw; every env of a group is cut
at the same index, which keeps their returns comparable.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp


def discounted_returns(rewards: jax.Array, dones: jax.Array, gamma: float | jax.Array) -> jax.Array:
  """Return-to-go [T, N] within each episode of the window, no bootstrap past row T - 1 (gamma:
  one discount, or one per row)."""
  not_done = 1.0 - dones.astype(jnp.float32)
  gamma = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32), rewards.shape)

  def backward(carry, xs):
    r, nd, d = xs
    g = r + d * nd * carry
    return g, g

  _, returns = jax.lax.scan(backward, jnp.zeros_like(rewards[0], jnp.float32),
                            (rewards.astype(jnp.float32), not_done, gamma), reverse=True)
  return returns


def group_relative_advantages(rewards: jax.Array, dones: jax.Array, mask: jax.Array, group_size: int,
                              gamma: float | jax.Array, eps: float = 1e-8) -> jax.Array:
  """GRPO advantages [T, N]: return-to-go normalised over the valid envs of its group at the same t.

  rewards, dones, mask: [T, N]. `dones` stops the return flowing back across an
  episode boundary (the learner also cuts before an invalid row); rewards of
  invalid (mask False) rows are ignored. Statistics use the valid envs of the
  group only (population std); invalid rows and groups with a single valid env
  get advantage 0. A group whose returns are identical gets exactly 0: the
  deviations are taken from one member's return first, so no rounding residue
  is divided by a near-zero std.
  """
  chex.assert_rank([rewards, dones, mask], 2)
  chex.assert_equal_shape([rewards, dones, mask])
  t, n = rewards.shape
  check_group_size(group_size, n)
  valid = mask.astype(bool)
  returns = discounted_returns(jnp.where(valid, rewards, 0.0), dones, gamma)
  g = returns.reshape(t, n // group_size, group_size)
  m = valid.reshape(t, n // group_size, group_size).astype(jnp.float32)
  count = jnp.sum(m, axis=-1, keepdims=True)
  # Deviations from a member's return: exact zeros for identical returns, and a
  # shift of the group by a constant cancels before any rounding of the mean.
  ref = jnp.max(jnp.where(m > 0, g, -jnp.inf), axis=-1, keepdims=True)
  ref = jnp.where(count > 0, ref, 0.0)
  d = jnp.where(m > 0, g - ref, 0.0)
  mean = jnp.sum(d, axis=-1, keepdims=True) / jnp.maximum(count, 1.0)
  centred = jnp.where(m > 0, d - mean, 0.0)
  std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=-1, keepdims=True) / jnp.maximum(count, 1.0))
  adv = centred / (std + eps)
  return jax.lax.stop_gradient(adv.reshape(t, n))


def check_group_size(group_size: int, num_envs: int) -> None:
  """Groups are consecutive envs: group_size must divide the env count."""
  if group_size < 1 or num_envs % group_size:
    raise ValueError(f"group_size={group_size} must be >= 1 and divide num_envs={num_envs}")


def grouped_env_seeds(num_envs: int, group_size: int, seed: int) -> list[int]:
  """EnvPool per-env seeds (`env_seed`) that give every env of a group the same initial states.

  Env i gets seed + i // group_size: the envs of a group share their random
  stream, so they reset to the same state as long as they reset together
  (episodes of a fixed length, as MetaWorld's truncation, keep them in step).
  """
  check_group_size(group_size, num_envs)
  return [int(seed) + i // group_size for i in range(num_envs)]

"""Running mean/variance of observations, kept in the policy params.

Why in the params: the sampler and the learner must normalise with exactly the
same statistics for a given policy version, and a checkpoint must carry them.
Statistics merge batches with Chan et al.'s parallel update, so one update of
B samples equals B single-sample updates (up to rounding). With `max_count`
the history counts for at most that many samples, so statistics of a quantity
that keeps moving (the returns of a policy that improves) follow it instead of
averaging over the whole run.

Value targets use the same statistics (one dimension, `standardize` /
`unstandardize` without clipping): the critic predicts standardised returns,
so its loss and gradients keep one scale while the returns grow a hundredfold
as a task is learned.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class RunningStats:
  mean: jax.Array  # [D]
  var: jax.Array  # [D]
  count: jax.Array  # scalar float32


def init_stats(dim: int) -> RunningStats:
  return RunningStats(jnp.zeros(dim, jnp.float32), jnp.ones(dim, jnp.float32), jnp.zeros((), jnp.float32))


def update_stats(stats: RunningStats, x: jax.Array, weight: jax.Array | None = None,
                 max_count: float | None = None) -> RunningStats:
  """Merges samples x [..., D] (rows with weight 0 are ignored) into stats; with max_count the
  earlier statistics weigh as at most max_count samples."""
  x = x.reshape(-1, x.shape[-1]).astype(jnp.float32)
  w = jnp.ones(x.shape[0], jnp.float32) if weight is None else weight.reshape(-1).astype(jnp.float32)
  n = w.sum()
  safe_n = jnp.maximum(n, 1.0)
  if max_count is not None:
    stats = stats.replace(count=jnp.minimum(stats.count, max_count))
  batch_mean = (w[:, None] * x).sum(0) / safe_n
  batch_var = (w[:, None] * jnp.square(x - batch_mean)).sum(0) / safe_n
  total = stats.count + n
  delta = batch_mean - stats.mean
  frac = n / jnp.maximum(total, 1.0)
  mean = stats.mean + delta * frac
  # M2 of the merge, divided by the new count; the prior var of 1 at count 0 is dropped.
  m2 = stats.var * stats.count + batch_var * n + jnp.square(delta) * stats.count * frac
  var = jnp.where(total > 0, m2 / jnp.maximum(total, 1.0), stats.var)
  keep = n > 0
  return RunningStats(jnp.where(keep, mean, stats.mean), jnp.where(keep, var, stats.var), total)


def normalize(stats: RunningStats, x: jax.Array, clip: float = 10.0) -> jax.Array:
  return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


def standardize(stats: RunningStats, x: jax.Array) -> jax.Array:
  """x in units of one-dimensional stats (no clipping: value targets must stay exact)."""
  return (x - stats.mean[0]) / jnp.sqrt(stats.var[0] + 1e-8)


def unstandardize(stats: RunningStats, y: jax.Array) -> jax.Array:
  return y * jnp.sqrt(stats.var[0] + 1e-8) + stats.mean[0]


# -- rewards: divided by a running standard deviation of the discounted return --------------------


@flax.struct.dataclass
class ReturnNorm:
  """Reward normalisation state: each env's discounted return so far and running statistics of it.

  Rewards are divided by the standard deviation of the return an env has accumulated (its
  discounted sum of rewards since its episode began, updated every step, as Stable-Baselines3's
  VecNormalize does), so the critic's targets and the value loss keep one scale across tasks whose
  rewards differ a hundredfold, and as a task is learned. The statistics count every step of the
  run (no forgetting): the scale settles early and then barely moves, so the critic is not chasing
  a moving unit.
  """
  stats: RunningStats  # Of the discounted returns, one dimension.
  returns: jax.Array  # [num_envs] each env's discounted return so far (raw reward units).


RETURN_STATS_PRIOR = 1e-4  # The count the prior (mean 0, variance 1) weighs as; SB3's RunningMeanStd epsilon.


def init_return_norm(num_envs: int) -> ReturnNorm:
  # Every leaf strongly typed: a weak-typed count (from a Python float) came back strong from the
  # first update, so the second update compiled the whole update again.
  prior = jnp.asarray(RETURN_STATS_PRIOR, jnp.float32)
  stats = RunningStats(jnp.zeros(1, jnp.float32), jnp.ones(1, jnp.float32), prior)
  return ReturnNorm(stats, jnp.zeros(num_envs, jnp.float32))


def normalize_rewards(rn: ReturnNorm, rewards: jax.Array, done: jax.Array, valid: jax.Array,
                      gamma: float | jax.Array, env_ids: jax.Array, clip: float = 10.0
                      ) -> tuple[jax.Array, ReturnNorm]:
  """Rewards [T, N] of the envs `env_ids` [N] divided by the running std of the discounted return,
  step by step: at each step every valid env's return takes its reward, the statistics take the
  returns, the rewards are divided by the new std and clipped to +-clip, and returns of envs whose
  episode ended restart at 0. Invalid rows (automatic-reset steps) change nothing and give 0.
  Columns with the same env id must not occur (segments of one env are rare in one batch; see
  the learner)."""
  rewards = rewards.astype(jnp.float32)
  gamma = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32), rewards.shape)

  def step(carry, xs):
    stats, ret = carry
    r, d, v, g = xs
    ret = jnp.where(v, ret * g + r, ret)
    stats = update_stats(stats, ret[:, None], v)
    out = jnp.where(v, jnp.clip(r / jnp.sqrt(stats.var[0] + 1e-8), -clip, clip), 0.0)
    ret = jnp.where(v & d, 0.0, ret)
    return (stats, ret), out

  (stats, ret), out = jax.lax.scan(step, (rn.stats, rn.returns[env_ids]), (rewards, done, valid, gamma))
  return out, ReturnNorm(stats, rn.returns.at[env_ids].set(ret))

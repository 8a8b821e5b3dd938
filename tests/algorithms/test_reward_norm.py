"""Reward normalisation against a NumPy reference of Stable-Baselines3's VecNormalize.

The reference is written from VecNormalize's documented semantics: per env a discounted return
ret = gamma * ret + reward, a RunningMeanStd (mean 0, var 1, count 1e-4) updated with the returns
of all envs at every step, the reward divided by sqrt(var + 1e-8) and clipped to +-10, the return
of an env whose episode ended set to 0.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from ebrl import normalizer
from ebrl.learner import Learner, LearnerConfig
from ebrl.types import Rollout, SegmentBatch
from policies import make_policy
from sim_adapters.base import EnvSpec, ObsSpec


class ReferenceVecNormalize:
  def __init__(self, num_envs: int, gamma: float):
    self.mean, self.var, self.count = 0.0, 1.0, 1e-4
    self.ret = np.zeros(num_envs, np.float64)
    self.gamma = gamma

  def _update(self, x: np.ndarray) -> None:
    batch_mean, batch_var, n = x.mean(), x.var(), x.size
    delta, total = batch_mean - self.mean, self.count + n
    m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
    self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total

  def step(self, reward: np.ndarray, done: np.ndarray, envs: np.ndarray) -> np.ndarray:
    """One step of the envs `envs` (a reset step of the others does not happen here)."""
    self.ret[envs] = self.ret[envs] * self.gamma + reward
    self._update(self.ret[envs])
    out = np.clip(reward / np.sqrt(self.var + 1e-8), -10.0, 10.0)
    self.ret[envs[done]] = 0.0
    return out


def _episodes(rng, t: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  rewards = rng.gamma(2.0, 3.0, (t, n)).astype(np.float32) * (1 + np.arange(t)[:, None] / t)
  done = rng.random((t, n)) < 0.05
  return rewards, done


def test_two_batches_in_a_row_equal_the_reference_step_by_step():
  rng, gamma = np.random.default_rng(0), 0.99
  ref, rn = ReferenceVecNormalize(6, gamma), normalizer.init_return_norm(6)
  ids = jnp.arange(6, dtype=jnp.int32)
  for _ in range(2):  # The returns carry from one batch into the next.
    rewards, done = _episodes(rng, 40, 6)
    got, rn = normalizer.normalize_rewards(rn, rewards, done, np.ones_like(done), gamma, ids)
    want = np.stack([ref.step(rewards[t], done[t], np.arange(6)) for t in range(40)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rn.returns), ref.ret, rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(float(rn.stats.var[0]), ref.var, rtol=2e-5)
    np.testing.assert_allclose(float(rn.stats.count), ref.count, rtol=1e-6)


def test_reset_steps_change_nothing_and_segments_follow_their_envs():
  """Invalid rows (automatic-reset steps) neither add to a return nor to the statistics, and give 0;
  segments of envs 4, 1 (columns in any order) continue those envs' returns."""
  rng, gamma = np.random.default_rng(1), 0.9
  ref, rn = ReferenceVecNormalize(5, gamma), normalizer.init_return_norm(5)
  rewards, done = _episodes(rng, 30, 5)
  rn = normalizer.normalize_rewards(rn, rewards, done, np.ones_like(done), gamma, jnp.arange(5, dtype=jnp.int32))[1]
  for t in range(30):
    ref.step(rewards[t], done[t], np.arange(5))
  envs = np.array([4, 1])
  seg_rewards, seg_done = _episodes(rng, 20, 2)
  valid = np.ones((20, 2), bool)
  valid[7, 0] = False  # Env 4's reset step.
  got, rn = normalizer.normalize_rewards(rn, seg_rewards, seg_done, valid, gamma, jnp.asarray(envs, jnp.int32))
  want = np.zeros((20, 2))
  for t in range(20):
    live = valid[t]
    want[t, live] = ref.step(seg_rewards[t, live], seg_done[t, live], envs[live])
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(rn.returns), ref.ret, rtol=2e-5, atol=1e-4)


SPEC = EnvSpec("toy", {"state": ObsSpec((3,), np.dtype(np.float32))}, 2, -np.ones(2, np.float32),
               np.ones(2, np.float32), 10, False)
T, N = 8, 4


def _rollout(rng, rewards, done) -> Rollout:
  return Rollout(obs={"state": rng.normal(size=(T, N, 3)).astype(np.float32)},
                 actions=rng.uniform(-1, 1, (T, N, 2)).astype(np.float32), logp=np.full((T, N), -2.0, np.float32),
                 values=rng.normal(size=(T + 1, N)).astype(np.float32), rewards=rewards, terminated=done, done=done,
                 valid=np.ones((T, N), bool), version=np.zeros((T, N), np.int32))


@pytest.mark.parametrize("segments", [False, True])
def test_an_update_learns_from_the_normalised_rewards(segments):
  """The learner with reward_norm on equals the learner with it off given the reference's rewards
  (times reward_scale), for a Rollout and for the same data as segments; its state carries the
  returns and statistics into the next update."""
  policy = make_policy("mlp", SPEC, ml_collections.ConfigDict(dict(hidden=(8,), init_log_std=0.0)))
  on = LearnerConfig(epochs=1, num_minibatches=2, reward_scale=0.5, reward_norm=True, num_envs=N)
  off = dataclasses.replace(on, reward_norm=False)
  rng = np.random.default_rng(2)
  rewards, done = _episodes(rng, T, N)
  ro = _rollout(rng, rewards, done)
  ref = ReferenceVecNormalize(N, on.gamma)
  normalised = np.stack([ref.step(rewards[t], done[t], np.arange(N)) for t in range(T)]).astype(np.float32)
  state = Learner(policy, on).init(jax.random.PRNGKey(0))
  copy = lambda s: jax.tree.map(jnp.copy, s)
  if segments:
    obs = {"state": np.concatenate([ro.obs["state"], ro.obs["state"][-1:]])}
    batch = lambda r: SegmentBatch(obs=obs, actions=ro.actions, logp=ro.logp, rewards=r, terminated=done, done=done,
                                   valid=ro.valid, version=ro.version, env_ids=np.arange(N, dtype=np.int32))
    got, metrics = Learner(policy, on).update_segments(copy(state), batch(rewards))
    want, _ = Learner(policy, off).update_segments(copy(state), batch(normalised))
  else:
    got, metrics = Learner(policy, on).update(copy(state), ro)
    want, _ = Learner(policy, off).update(copy(state), ro.replace(rewards=normalised))
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got.reward_norm.returns), ref.ret, rtol=2e-5, atol=1e-4)
  np.testing.assert_allclose(float(metrics["reward_norm_std"]), np.sqrt(ref.var), rtol=2e-5)


def test_a_device_bootstrap_is_added_after_scaling_and_never_normalised():
  """A device simulator's truncation bootstrap (gamma * V(final obs), in the critic's units) joins
  the reward after normalisation and scaling: it is not a reward, and it must not count in the
  return statistics."""
  policy = make_policy("mlp", SPEC, ml_collections.ConfigDict(dict(hidden=(8,), init_log_std=0.0)))
  cfg = LearnerConfig(epochs=1, num_minibatches=2, reward_scale=0.5, reward_norm=True, num_envs=N)
  learner = Learner(policy, cfg)
  state = learner.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(3)
  rewards, done = _episodes(rng, T, N)
  bootstrap = np.where(done, 7.0, 0.0).astype(np.float32)
  got, rn = learner._rewards(state, rewards, done, np.ones_like(done), cfg.gamma, None, bootstrap)  # pylint: disable=protected-access
  plain, rn_plain = learner._rewards(state, rewards, done, np.ones_like(done), cfg.gamma, None, None)  # pylint: disable=protected-access
  np.testing.assert_allclose(np.asarray(got), np.asarray(plain) + bootstrap, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(rn.returns), np.asarray(rn_plain.returns))

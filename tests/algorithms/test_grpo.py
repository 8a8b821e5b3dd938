"""GRPO: group-relative advantages against a NumPy reference, the learner's grpo update, same-seed groups."""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl.algorithms.grpo import group_relative_advantages, grouped_env_seeds
from ebrl.learner import Learner, LearnerConfig
from ebrl.types import SegmentBatch
from policies.mlp import MLPPolicy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from learner_device_check import N, make_rollout, make_spec  # pylint: disable=g-import-not-at-top,g-bad-import-order


def ref_advantages(rewards, dones, mask, group_size, gamma, eps=1e-8):
  """Plain loops in float64: return-to-go per env and episode, then per-group normalisation."""
  t_len, n = rewards.shape
  returns = np.zeros((t_len, n))
  for i in range(n):
    running = 0.0
    for t in range(t_len - 1, -1, -1):
      if dones[t, i]:
        running = 0.0
      running = (rewards[t, i] if mask[t, i] else 0.0) + gamma * running
      returns[t, i] = running
  adv = np.zeros((t_len, n))
  for t in range(t_len):
    for g0 in range(0, n, group_size):
      members = [i for i in range(g0, g0 + group_size) if mask[t, i]]
      if not members:
        continue
      vals = np.array([returns[t, i] for i in members])
      mean, std = vals.mean(), vals.std()
      for i in members:
        adv[t, i] = (returns[t, i] - mean) / (std + eps)
  return adv, returns


def random_data(seed, t_len=12, n=8, p_done=0.15, p_invalid=0.1):
  rng = np.random.default_rng(seed)
  rewards = rng.normal(0.5, 1.0, (t_len, n)).astype(np.float32)
  dones = rng.random((t_len, n)) < p_done
  mask = rng.random((t_len, n)) >= p_invalid
  return rewards, dones, mask


@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_advantages_match_numpy_reference(group_size):
  rewards, dones, mask = random_data(seed=group_size)
  assert dones.any() and (~mask).any()
  adv = np.asarray(group_relative_advantages(rewards, dones, mask, group_size, gamma=0.9))
  ref, _ = ref_advantages(rewards.astype(np.float64), dones, mask, group_size, 0.9)
  # A group whose valid members are one env (or none) has no baseline: advantage 0.
  np.testing.assert_allclose(adv, ref, atol=2e-5, rtol=1e-4)
  assert np.all(adv[~mask] == 0.0)
  if group_size == 1:
    assert np.all(adv == 0.0)
  # Per group and time, the valid advantages have mean 0 and (when they differ) std 1.
  g = adv.reshape(adv.shape[0], -1, group_size)
  m = mask.reshape(g.shape)
  for t in range(g.shape[0]):
    for k in range(g.shape[1]):
      vals = g[t, k][m[t, k]]
      if len(vals) >= 2:
        assert abs(vals.mean()) < 1e-5 and abs(vals.std() - 1.0) < 1e-4


def test_identical_returns_give_zero_advantage():
  rng = np.random.default_rng(0)
  per_group = rng.normal(3.0, 2.0, (10, 3)).astype(np.float32)  # 3 groups of 4 identical envs
  rewards = np.repeat(per_group, 4, axis=1)
  dones = np.zeros_like(rewards, bool)
  dones[4] = True  # same episode boundary in every env
  mask = np.ones_like(dones)
  adv = np.asarray(group_relative_advantages(rewards, dones, mask, 4, gamma=0.99))
  assert np.all(adv == 0.0)


def test_invariant_to_a_constant_reward_per_group():
  rewards, dones, mask = random_data(seed=3)
  # A different constant for each group, added to every env of the group and every step.
  shifted = rewards + np.repeat(np.array([[7.5, -3.0]], np.float32), 4, axis=1)
  # Envs of a group must share their episode boundaries for a constant reward to shift
  # their returns equally: use the first env's dones for its whole group.
  same_dones = np.repeat(dones[:, ::4], 4, axis=1)
  same_mask = np.repeat(mask[:, ::4], 4, axis=1)
  adv = np.asarray(group_relative_advantages(rewards, same_dones, same_mask, 4, gamma=0.95))
  adv_shifted = np.asarray(group_relative_advantages(shifted, same_dones, same_mask, 4, gamma=0.95))
  np.testing.assert_allclose(adv_shifted, adv, atol=5e-4)
  assert np.abs(adv).max() > 0.5


def test_rejects_group_size_that_does_not_divide():
  rewards, dones, mask = random_data(seed=0, n=6)
  with pytest.raises(ValueError, match="group_size=4"):
    group_relative_advantages(rewards, dones, mask, 4, gamma=0.9)
  assert grouped_env_seeds(6, 2, 10) == [10, 10, 11, 11, 12, 12]
  with pytest.raises(ValueError, match="group_size=4"):
    grouped_env_seeds(6, 4, 0)


# ----------------------------------------------------------------------------- learner


def test_learner_grpo_update_changes_params():
  policy = MLPPolicy(make_spec(), hidden=(16, 16))
  cfg = LearnerConfig(algorithm="grpo", group_size=2, gamma=0.9, epochs=2, num_minibatches=2, learning_rate=3e-3)
  assert N % cfg.group_size == 0
  learner = Learner(policy, cfg)
  state = learner.init(jax.random.key(0))
  before = jax.tree.map(np.array, state.params)
  rollout = make_rollout(policy, before, seed=1, p_end=0.2)
  state, metrics = learner.update(state, rollout)
  metrics = {k: float(v) for k, v in metrics.items()}
  assert all(np.isfinite(v) for v in metrics.values()), metrics
  assert int(state.version) == 1 and int(state.skipped_updates) == 0
  moved = [np.max(np.abs(np.asarray(a) - b)) for a, b in
           zip(jax.tree.leaves(state.params["net"]["actor"]), jax.tree.leaves(before["net"]["actor"]))]
  assert max(moved) > 1e-4
  # Critic-free: no gradient reaches the value head, and its loss is against its own predictions.
  for a, b in zip(jax.tree.leaves(state.params["net"]["critic"]), jax.tree.leaves(before["net"]["critic"])):
    np.testing.assert_array_equal(np.asarray(a), b)
  assert metrics["value_loss"] < 1e-8


def test_learner_grpo_rejects_segments_and_bad_group_size():
  policy = MLPPolicy(make_spec(), hidden=(8,))
  with pytest.raises(ValueError, match="group_size >= 2"):
    Learner(policy, LearnerConfig(algorithm="grpo", group_size=1))
  with pytest.raises(ValueError, match="valid: ppo, grpo"):
    Learner(policy, LearnerConfig(algorithm="reinforce"))
  learner = Learner(policy, LearnerConfig(algorithm="grpo", group_size=2))
  z = jnp.zeros((2, 4), jnp.float32)
  batch = SegmentBatch(obs={"state": jnp.zeros((3, 4, 5))}, actions=jnp.zeros((2, 4, 2)), logp=z, rewards=z,
                       terminated=z.astype(bool), done=z.astype(bool), valid=z.astype(bool),
                       version=z.astype(jnp.int32))
  with pytest.raises(ValueError, match="scheduler=sync"):
    learner.update_segments(learner.init(jax.random.key(0)), batch)


def test_ppo_default_unchanged_by_grpo_fields():
  assert LearnerConfig().algorithm == "ppo" and LearnerConfig().group_size == 1
  assert dataclasses.replace(LearnerConfig(), algorithm="grpo", group_size=4).ppo == LearnerConfig().ppo


# ----------------------------------------------------------------------------- same-seed env groups


def test_same_env_seed_resets_to_same_state():
  import envpool

  s, t = grouped_env_seeds(4, 2, seed=123)[::2]
  pool = envpool.make("MetaWorld/Reach-v3", env_type="gymnasium", num_envs=4, env_seed=[s, s, t, t],
                      partially_observable=False)
  try:
    for _ in range(2):  # The first reset and the next one (the shared random stream stays in step).
      obs, _ = pool.reset()
      obs = np.asarray(obs)
      np.testing.assert_array_equal(obs[0], obs[1])
      np.testing.assert_array_equal(obs[2], obs[3])
      assert not np.allclose(obs[0], obs[2])  # Different seeds: different goals.
  finally:
    pool.close()

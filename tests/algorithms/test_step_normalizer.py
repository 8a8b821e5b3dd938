"""obs_norm_update="every_step": observations counted and normalised as each env step returns them
(VecNormalize's timing), the policy acting and the learner training on exactly those inputs.

References: the statistics against NumPy's mean and variance of every observation counted so far;
the update on pre-normalised inputs against the update on raw inputs with the same statistics; a
short sync run's final statistics against NumPy over the observations its env really returned.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from ebrl import normalizer
from ebrl.algorithms.ppo import PPOConfig
from ebrl.learner import Learner, LearnerConfig
from ebrl.param_store import ParamStore
from ebrl.sampler import Sampler
from ebrl.step_normalizer import StepNormalizer, identity_stats
from ebrl.types import Rollout
from policies import make_policy
from sim_adapters.base import EnvSpec, ObsSpec

T, N, DIM, ACT = 6, 4, 5, 2


def _reference(rows: list[np.ndarray], counted: list[np.ndarray]) -> list[np.ndarray]:
  """Each step's rows normalised by the mean / variance of every row counted up to and including
  that step (float64), clipped to +-10."""
  seen, out = [], []
  for x, c in zip(rows, counted):
    seen.append(x[c])
    allx = np.concatenate(seen).astype(np.float64)
    out.append(np.clip((x - allx.mean(0)) / np.sqrt(allx.var(0) + 1e-8), -10, 10))
  return out


def test_statistics_take_every_step_before_normalising_and_skip_final_observations():
  rng = np.random.default_rng(0)
  # Two keys of different widths (split back after normalising) and a key the policy does not read.
  rows = [rng.normal(loc=3.0, scale=[0.5, 2.0, 1.0], size=(N, 3)).astype(np.float32) for _ in range(T)]
  extra = [rng.normal(size=(N, 2)).astype(np.float32) for _ in range(T)]
  counted = [np.ones(N, bool)] + [rng.random(N) > 0.3 for _ in range(T - 1)]
  norm = StepNormalizer(("a", "b"), normalizer.init_stats(5))
  got = [norm({"a": r, "b": e, "other": np.full((N, 1), 7.0)}, c) for r, e, c in zip(rows, extra, counted)]
  want = _reference([np.concatenate([r, e], -1) for r, e in zip(rows, extra)], counted)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.concatenate([g["a"], g["b"]], -1), w, atol=2e-5)
    np.testing.assert_array_equal(g["other"], 7.0)  # Passed through.
  allx = np.concatenate([np.concatenate([r, e], -1)[c] for r, e, c in zip(rows, extra, counted)])
  np.testing.assert_allclose(norm.stats.mean, allx.mean(0), atol=1e-5)
  np.testing.assert_allclose(norm.stats.var, allx.var(0), rtol=1e-4)
  assert float(norm.stats.count) == sum(int(c.sum()) for c in counted)


def test_identity_statistics_leave_normalised_inputs_exactly_as_they_are():
  z = jnp.asarray(np.random.default_rng(1).uniform(-10, 10, size=(64, DIM)).astype(np.float32))
  np.testing.assert_array_equal(np.asarray(normalizer.normalize(identity_stats(DIM), z)), np.asarray(z))


@pytest.fixture(scope="module")
def parts():
  spec = EnvSpec("toy", {"state": ObsSpec((DIM,), np.dtype(np.float32))}, ACT, -np.ones(ACT, np.float32),
                 np.ones(ACT, np.float32), 10, False)
  policy = make_policy("mlp", spec, ml_collections.ConfigDict(dict(hidden=(8, 8), init_log_std=0.0)))
  rng = np.random.default_rng(2)
  x = rng.normal(loc=2.0, scale=3.0, size=(T + 1, N, DIM)).astype(np.float32)
  stats = normalizer.update_stats(normalizer.init_stats(DIM), jnp.asarray(x))
  return spec, policy, x, stats


def _learner(policy, obs_norm_update: str) -> Learner:
  return Learner(policy, LearnerConfig(gamma=0.99, gae_lambda=0.95, epochs=2, num_minibatches=2, learning_rate=1e-3,
                                       obs_norm_update=obs_norm_update, ppo=PPOConfig(clip_eps=0.2, vf_coef=1.0)))


def test_the_update_on_inputs_normalised_while_acting_is_the_update_on_raw_inputs_with_those_statistics(parts):
  _, policy, x, stats = parts
  z = np.asarray(normalizer.normalize(stats, jnp.asarray(x)))
  rng = np.random.default_rng(3)
  ended = np.zeros((T, N), bool)
  ended[2, 1] = True
  rollout = lambda obs: Rollout(
      obs={"state": jnp.asarray(obs[:T])}, actions=jnp.asarray(rng.normal(size=(T, N, ACT)).astype(np.float32)),
      logp=jnp.full((T, N), -2.0), values=jnp.asarray(rng.normal(size=(T + 1, N)).astype(np.float32)),
      rewards=jnp.asarray(rng.normal(size=(T, N)).astype(np.float32)), terminated=jnp.asarray(ended),
      done=jnp.asarray(ended), valid=jnp.ones((T, N), bool), version=jnp.zeros((T, N), jnp.int32))
  rng = np.random.default_rng(3)
  raw_ro = rollout(x)
  rng = np.random.default_rng(3)
  normed_ro = rollout(z)
  after, every = _learner(policy, "after"), _learner(policy, "every_step")
  start = after.init(jax.random.PRNGKey(0))
  start = start.replace(params={**start.params, "obs_norm": stats})
  want, _ = after.update(jax.tree.map(jnp.copy, start), raw_ro)
  got, _ = every.update(jax.tree.map(jnp.copy, start), normed_ro)
  diffs = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), got.params["net"], want.params["net"])
  assert max(jax.tree.leaves(diffs)) < 1e-5, diffs
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), got.params["net"], start.params["net"])
  assert max(jax.tree.leaves(moved)) > 1e-4  # The update did something.
  # The statistics are the acting loop's: the update leaves them as they are ("after" merges).
  for a, b in zip(jax.tree.leaves(got.params["obs_norm"]), jax.tree.leaves(stats)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(want.params["obs_norm"].count) > float(stats.count)
  with pytest.raises(ValueError, match="every_step"):
    every.update_segments(got, None)


def test_a_prenormalised_sampler_acts_as_the_plain_one_on_raw_inputs(parts):
  spec, policy, x, stats = parts
  params = policy.init(jax.random.PRNGKey(0))
  params = {**params, "obs_norm": stats}
  store = ParamStore()
  store.publish_params(params, 0)
  plain, pre = Sampler(policy, spec, store, seed=5), Sampler(policy, spec, store, seed=5, prenormalized=True)
  raw = {"state": x[0]}
  z = {"state": np.asarray(normalizer.normalize(stats, jnp.asarray(x[0])))}
  a, _ = plain.act(raw)
  b, _ = pre.act(z)
  for f in ("action", "logp", "value"):
    np.testing.assert_allclose(getattr(b, f), getattr(a, f), atol=1e-5)
  np.testing.assert_allclose(pre.value(z), plain.value(raw), atol=1e-5)


def test_a_sync_run_counts_every_observation_its_env_returned_but_final_ones(tmp_path):
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top
  from launch.configs import default  # pylint: disable=g-import-not-at-top

  cfg = default.get_config()
  cfg.num_envs, cfg.rollout_length, cfg.total_env_steps = 4, 8, 64
  cfg.env.max_episode_steps = 5  # Episodes end inside the run: final observations are not counted.
  cfg.algorithm.obs_norm_update = "every_step"
  cfg.algorithm.epochs, cfg.algorithm.num_minibatches = 1, 1
  cfg.policy.hidden = (8, 8)
  cfg.checkpoint_every_s = 1e9
  trainer = Trainer(cfg, str(tmp_path), progress=False)
  adapter = trainer.host_envs[0]
  seen: list[tuple[np.ndarray, np.ndarray]] = []
  recv = adapter.recv  # Every batch the env returns, the reset's and each step's, passes here.

  def record(*args):
    batch = recv(*args)
    seen.append((batch.obs["state"].copy(), ~batch.done))
    return batch

  adapter.recv = record
  trainer.train()
  state = trainer.state
  trainer.finish()
  assert any((~c).any() for _, c in seen)  # Some episode ended.
  assert sum(len(x) for x, _ in seen) == 4 + cfg.total_env_steps
  allx = np.concatenate([x[c] for x, c in seen]).astype(np.float64)
  stats = jax.device_get(state.params["obs_norm"])
  assert float(stats.count) == len(allx)
  np.testing.assert_allclose(stats.mean, allx.mean(0), atol=1e-4)
  np.testing.assert_allclose(stats.var, allx.var(0), rtol=1e-3, atol=1e-6)

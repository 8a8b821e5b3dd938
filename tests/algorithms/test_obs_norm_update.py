"""When the observation statistics take an update's batch, against a NumPy reference.

`algorithm.obs_norm_update="before"` merges the batch into the statistics first (as VecNormalize
counts an observation before normalising it), takes the batch's log-probs again under them as the
proximal ones and weighs the clipped objective by proximal / acting probability (capped at
behaviour_weight_clip). "after" trains on the statistics the batch was acted with and merges the
batch afterwards. The reference recomputes, in float64 NumPy from the params: the statistics
(Chan's merge from mean 0 / var 1 / count 0), the normalised inputs, both MLPs, the Gaussian
log-probs, GAE, the per-minibatch advantage normalisation and the first minibatch step's policy
and value losses (with the learning rate 0 the step changes nothing, so the loss is the one at
the params the update starts from).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from ebrl.learner import Learner, LearnerConfig
from ebrl.types import Rollout, SegmentBatch
from policies import make_policy
from sim_adapters.base import EnvSpec, ObsSpec

SPEC = EnvSpec("toy", {"state": ObsSpec((3,), np.dtype(np.float32))}, 2, -np.ones(2, np.float32),
               np.ones(2, np.float32), 10, False)
T, N = 8, 4
GAMMA, LAM = 0.9, 0.8


def _mlp(p: dict, x: np.ndarray) -> np.ndarray:
  layers = sorted(p, key=lambda k: int(k.split("_")[1]))
  for name in layers[:-1]:
    x = np.tanh(x @ np.asarray(p[name]["kernel"], np.float64) + np.asarray(p[name]["bias"], np.float64))
  last = p[layers[-1]]
  return x @ np.asarray(last["kernel"], np.float64) + np.asarray(last["bias"], np.float64)


def _reference(params: dict, stats: tuple[np.ndarray, np.ndarray], obs: np.ndarray, actions: np.ndarray,
               acting_logp: np.ndarray, values: np.ndarray, rewards: np.ndarray, done: np.ndarray,
               weight_clip: float, value_from_params: bool) -> tuple[float, float]:
  """(policy loss, value loss) of one full-batch step: inputs normalised by `stats`, the proximal
  log-probs from the params under them, each sample weighed by min(prox / acting, clip)."""
  mean, var = stats
  x = np.clip((obs.astype(np.float64) - mean) / np.sqrt(var + 1e-8), -10, 10)
  net = params["net"]
  mu = _mlp(net["actor"], x)
  log_std = np.asarray(net["log_std"], np.float64)
  prox = np.sum(-0.5 * np.square((actions[:T] - mu[:T]) / np.exp(log_std)) - log_std - 0.5 * np.log(2 * np.pi), -1)
  v = _mlp(net["critic"], x)[..., 0] if value_from_params else values
  adv, last = np.zeros((T, N)), np.zeros(N)
  for t in reversed(range(T)):
    delta = rewards[t] + GAMMA * v[t + 1] - v[t]  # Nothing terminates; a truncation bootstraps.
    last = delta + GAMMA * LAM * (1.0 - done[t]) * last
    adv[t] = last
  returns = adv + v[:T]
  a = (adv - adv.mean()) / (adv.std() + 1e-8)
  weight = np.minimum(np.exp(prox - acting_logp), weight_clip)
  value_now = _mlp(net["critic"], x[:T])[..., 0]
  return float(np.mean(-weight * a)), float(0.5 * np.mean(np.square(value_now - returns)))


def _merged(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  flat = obs.reshape(-1, obs.shape[-1]).astype(np.float64)
  return flat.mean(0), flat.var(0)  # From count 0 the prior drops out.


@pytest.fixture(scope="module")
def setup():
  policy = make_policy("mlp", SPEC, ml_collections.ConfigDict(dict(hidden=(8,), init_log_std=-0.3)))
  rng = np.random.default_rng(0)
  # Observations far from mean 0 / var 1, so the first merge moves the statistics a lot.
  obs = (3.0 + 2.5 * rng.normal(size=(T + 1, N, 3))).astype(np.float32)
  key = jax.random.PRNGKey(1)
  state = Learner(policy, LearnerConfig()).init(key)
  # Acted with the params the update starts from (statistics mean 0 / var 1).
  actions, acting_logp, values, _ = policy.sample(state.params, {"state": obs}, jax.random.PRNGKey(2))
  rewards = rng.normal(size=(T, N)).astype(np.float32)
  done = rng.random((T, N)) < 0.15
  return policy, state, obs, np.asarray(actions), np.asarray(acting_logp), np.asarray(values), rewards, done


def _config(when: str) -> LearnerConfig:
  return LearnerConfig(gamma=GAMMA, gae_lambda=LAM, epochs=1, num_minibatches=1, learning_rate=0.0,
                       obs_norm_update=when)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("segments", [False, True])
def test_the_objective_and_statistics_equal_the_reference(setup, when, segments):
  policy, state, obs, actions, acting_logp, values, rewards, done = setup
  copy = jax.tree.map(jnp.copy, state)
  learner = Learner(policy, _config(when))
  if segments:  # Values from the params the update starts from; the last row bootstraps.
    batch = SegmentBatch(obs={"state": obs}, actions=actions[:T], logp=acting_logp[:T], rewards=rewards,
                         terminated=np.zeros((T, N), bool), done=done, valid=np.ones((T, N), bool),
                         version=np.zeros((T, N), np.int32), env_ids=np.arange(N, dtype=np.int32))
    new, metrics = learner.update_segments(copy, batch)
  else:
    ro = Rollout(obs={"state": obs[:T]}, actions=actions[:T], logp=acting_logp[:T], values=values,
                 rewards=rewards, terminated=np.zeros((T, N), bool), done=done, valid=np.ones((T, N), bool),
                 version=np.zeros((T, N), np.int32))
    new, metrics = learner.update(copy, ro)
  merged = _merged(obs[:T])
  # The statistics after the update take the batch either way.
  np.testing.assert_allclose(np.asarray(new.params["obs_norm"].mean), merged[0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(new.params["obs_norm"].var), merged[1], rtol=1e-4)
  # What the update trained on differs: the merged statistics, or the ones it was acted with.
  stats = merged if when == "before" else (np.zeros(3), np.ones(3))
  want_pg, want_v = _reference(jax.device_get(state.params), stats, obs, actions, acting_logp[:T], values, rewards,
                               done.astype(np.float64), learner.cfg.ppo.behaviour_weight_clip, value_from_params=segments)
  np.testing.assert_allclose(float(metrics["policy_loss"]), want_pg, rtol=2e-4, atol=1e-6)
  np.testing.assert_allclose(float(metrics["value_loss"]), want_v, rtol=2e-4, atol=1e-6)
  # The clipped ratio is against the proximal log-probs, so the first step measures no KL.
  assert float(metrics["approx_kl"]) == pytest.approx(0.0, abs=1e-7)
  assert float(metrics["obs_norm_shift"]) > 1.0  # The merge moved the mean by over one std.


def test_before_and_after_differ_when_the_statistics_move(setup):
  """The check above is not vacuous: with statistics that move, the two timings train on different
  inputs and give different losses."""
  policy, state, obs, actions, acting_logp, values, rewards, done = setup
  ro = Rollout(obs={"state": obs[:T]}, actions=actions[:T], logp=acting_logp[:T], values=values,
               rewards=rewards, terminated=np.zeros((T, N), bool), done=done, valid=np.ones((T, N), bool),
               version=np.zeros((T, N), np.int32))
  losses = {}
  for when in ("before", "after"):
    _, metrics = Learner(policy, _config(when)).update(jax.tree.map(jnp.copy, state), ro)
    losses[when] = float(metrics["value_loss"])
  assert abs(losses["before"] - losses["after"]) > 1e-3 * abs(losses["after"])


def test_an_unknown_timing_is_refused():
  policy = make_policy("mlp", SPEC, ml_collections.ConfigDict(dict(hidden=(8,), init_log_std=0.0)))
  with pytest.raises(ValueError, match="unknown obs_norm_update 'during'; valid: after, before"):
    Learner(policy, LearnerConfig(obs_norm_update="during"))

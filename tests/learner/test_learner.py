"""The learner's update against an independent re-implementation, and its invariants.

The reference here recomputes GAE in NumPy, the PPO loss in jnp (differentiated
with jax.grad through `policy.evaluate`), global-norm clipping and Adam in
NumPy, and the observation statistics in NumPy. The multi-device check runs
tests/learner_device_check.py in fresh processes with 1 and 4 CPU devices.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl.algorithms.ppo import PPOConfig
from ebrl.learner import Learner, LearnerConfig
from ebrl.types import Rollout, SegmentBatch
from policies.mlp import MLPPolicy
from sim_adapters.base import EnvSpec, ObsSpec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from learner_device_check import ACTION_DIM, N, OBS_DIM, T, make_rollout, make_spec  # pylint: disable=g-bad-import-order

CFG = LearnerConfig(gamma=0.9, gae_lambda=0.8, epochs=1, num_minibatches=1, learning_rate=3e-3,
                    max_grad_norm=0.5, reward_scale=2.0,
                    ppo=PPOConfig(clip_eps=0.2, value_clip_eps=0.2, vf_coef=0.5, ent_coef=0.01,
                                  normalize_advantages=True))


tiny_spec = make_spec  # The same tiny env as the multi-device check.


def _is_key(x) -> bool:
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def host(tree):
  """A copy that owns its memory (the learner donates its input state): NumPy
  arrays, except typed PRNG keys, which stay (copied) JAX arrays."""
  return jax.tree.map(lambda x: x.copy() if _is_key(x) else np.array(x, copy=True), tree)


def device(tree):
  return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def tree_equal(a, b) -> bool:
  unkey = lambda x: jax.random.key_data(x) if _is_key(x) else x
  la, lb = jax.tree.leaves(jax.tree.map(unkey, a)), jax.tree.leaves(jax.tree.map(unkey, b))
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


@pytest.fixture(scope="module", autouse=True)
def _full_precision_matmuls():
  # No effect on CPU; on a GPU it keeps float32 matmuls out of TF32, so the
  # learner and the reference agree to the tolerances used here.
  with jax.default_matmul_precision("highest"):
    yield


@pytest.fixture(scope="module")
def setup():
  policy = MLPPolicy(tiny_spec(), hidden=(16, 16))
  learner = Learner(policy, CFG)
  state0 = host(learner.init(jax.random.key(0)))
  rollout = make_rollout(policy, state0.params, seed=0, p_end=0.2)
  assert rollout.terminated.any() and (rollout.done & ~rollout.terminated).any() and (~rollout.valid).sum() >= 2
  return dict(policy=policy, learner=learner, state0=state0, rollout=rollout)


def run_update(setup, state, rollout):
  new_state, metrics = setup["learner"].update(device(state), rollout)
  return host(new_state), {k: float(v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------- reference


def ref_gae(rewards, values, terminated, done, gamma, lam):
  rewards, values = rewards.astype(np.float64), values.astype(np.float64)
  adv = np.zeros_like(rewards)
  running = np.zeros(rewards.shape[1])
  for t in range(rewards.shape[0] - 1, -1, -1):
    target = rewards[t] + np.where(terminated[t], 0.0, gamma * values[t + 1])
    running = target - values[t] + np.where(done[t], 0.0, gamma * lam * running)
    adv[t] = running
  return adv, adv + values[:-1]


def ref_loss(net, obs_norm, batch, policy, ppo):
  logp, entropy, value = policy.evaluate({"net": net, "obs_norm": obs_norm}, {"state": batch["obs"]},
                                         batch["actions"])
  w = batch["mask"] / jnp.sum(batch["mask"])
  adv = batch["adv"]
  if ppo.normalize_advantages:
    mu = jnp.sum(w * adv)
    adv = (adv - mu) / (jnp.sqrt(jnp.sum(w * (adv - mu) ** 2)) + 1e-8)
  ratio = jnp.exp(logp - batch["logp"])
  surrogate = jnp.where(adv >= 0, jnp.minimum(ratio, 1 + ppo.clip_eps), jnp.maximum(ratio, 1 - ppo.clip_eps)) * adv
  policy_loss = -jnp.sum(w * surrogate)
  v_clipped = jnp.clip(value, batch["values"] - ppo.value_clip_eps, batch["values"] + ppo.value_clip_eps)
  v_err = jnp.maximum((value - batch["returns"]) ** 2, (v_clipped - batch["returns"]) ** 2)
  value_loss = 0.5 * jnp.sum(w * v_err)
  ent = jnp.sum(w * entropy)
  loss = policy_loss + ppo.vf_coef * value_loss - ppo.ent_coef * ent
  return loss, dict(policy_loss=policy_loss, value_loss=value_loss, entropy=ent,
                    approx_kl=jnp.sum(w * (ratio - 1 - jnp.log(ratio))),
                    clip_fraction=jnp.sum(w * (jnp.abs(ratio - 1) > ppo.clip_eps)))


class NumpyAdam:
  """optax.chain(clip_by_global_norm(max_norm), adam(lr, eps=1e-5)), written out in float64."""

  def __init__(self, params, lr, max_norm, b1=0.9, b2=0.999, eps=1e-5):
    self.m = [np.zeros_like(p, np.float64) for p in params]
    self.v = [np.zeros_like(p, np.float64) for p in params]
    self.t, self.lr, self.max_norm, self.b1, self.b2, self.eps = 0, lr, max_norm, b1, b2, eps

  def step(self, params, grads):
    grads = [np.asarray(g, np.float64) for g in grads]
    norm = np.sqrt(sum(np.sum(g * g) for g in grads))
    if norm >= self.max_norm:
      grads = [g * self.max_norm / norm for g in grads]
    self.t += 1
    out = []
    for i, (p, g) in enumerate(zip(params, grads)):
      self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g
      self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g * g
      m_hat = self.m[i] / (1 - self.b1 ** self.t)
      v_hat = self.v[i] / (1 - self.b2 ** self.t)
      out.append(np.asarray(p, np.float64) - self.lr * m_hat / (np.sqrt(v_hat) + self.eps))
    return out, norm


@pytest.fixture(scope="module")
def reference(setup):
  """Two updates (epochs=1, one minibatch each) on the setup rollout, done by hand."""
  policy, ro = setup["policy"], setup["rollout"]
  grad_fn = jax.jit(jax.value_and_grad(lambda net, stats, b: ref_loss(net, stats, b, policy, CFG.ppo),
                                       has_aux=True))
  adv, ret = ref_gae(ro.rewards * CFG.reward_scale, ro.values, ro.terminated, ro.done, CFG.gamma,
                     CFG.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  batch = dict(obs=ro.obs["state"].reshape(T * N, OBS_DIM), actions=ro.actions.reshape(T * N, ACTION_DIM),
               logp=ro.logp.reshape(-1), values=ro.values[:-1].reshape(-1), adv=f32(adv.reshape(-1)),
               returns=f32(ret.reshape(-1)), mask=f32(ro.valid.reshape(-1)))
  valid_obs = ro.obs["state"][ro.valid].astype(np.float64)

  net = setup["state0"].params["net"]
  stats = setup["state0"].params["obs_norm"]
  treedef = jax.tree.structure(net)
  adam = NumpyAdam(jax.tree.leaves(net), CFG.learning_rate, CFG.max_grad_norm)
  steps = []
  for i in range(2):
    (loss, metrics), grads = grad_fn(net, stats, batch)
    leaves, grad_norm = adam.step(jax.tree.leaves(net), jax.tree.leaves(grads))
    net = jax.tree.unflatten(treedef, [f32(x) for x in leaves])
    # The normaliser sees the same valid rows at each update: its mean stays, the
    # count doubles and the merged variance equals the batch variance.
    stats = type(stats)(mean=f32(valid_obs.mean(0)), var=f32(valid_obs.var(0)),
                        count=np.float32(len(valid_obs) * (i + 1)))
    steps.append(dict(net=net, stats=stats, grad_norm=grad_norm, loss=float(loss),
                      metrics={k: float(v) for k, v in metrics.items()}))
  return steps


# ----------------------------------------------------------------------------- tests


def assert_tree_close(actual, desired, atol, rtol=1e-5):
  paths = jax.tree_util.tree_flatten_with_path(desired)[0]
  leaves = jax.tree.leaves(actual)
  assert len(paths) == len(leaves)
  for (path, d), a in zip(paths, leaves):
    np.testing.assert_allclose(a, d, atol=atol, rtol=rtol, err_msg=jax.tree_util.keystr(path))


def test_two_updates_match_reference(setup, reference):
  state = setup["state0"]
  for i, ref in enumerate(reference):
    before = state
    state, metrics = run_update(setup, state, setup["rollout"])
    # The step is large enough that the comparison means something.
    moved = max(np.max(np.abs(a - b)) for a, b in zip(jax.tree.leaves(state.params["net"]),
                                                      jax.tree.leaves(before.params["net"])))
    assert moved > 1e-3
    assert_tree_close(state.params["net"], ref["net"], atol=1e-6)
    assert_tree_close(state.params["obs_norm"], ref["stats"], atol=1e-5)
    np.testing.assert_allclose(metrics["loss"], ref["loss"], rtol=1e-5, atol=1e-6)
    for k, v in ref["metrics"].items():
      np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    assert int(state.version) == i + 1
    assert int(state.skipped_updates) == 0 and metrics["skipped_updates"] == 0
    assert metrics["staleness"] == float(i)  # the rollout came from version 0
  # First update: ratio exactly 1 (the normaliser is updated after the epochs).
  assert reference[0]["metrics"]["approx_kl"] == 0.0
  assert reference[0]["metrics"]["clip_fraction"] == 0.0
  # Second update: the clipped branches and gradient clipping were exercised.
  assert reference[1]["metrics"]["clip_fraction"] > 0
  assert max(r["grad_norm"] for r in reference) > CFG.max_grad_norm


def test_nonfinite_loss_skips_update(setup):
  ro = setup["rollout"]
  rewards = ro.rewards.copy()
  t, j = np.argwhere(ro.valid)[len(np.argwhere(ro.valid)) // 2]
  rewards[t, j] = np.nan
  state0 = setup["state0"]
  state, metrics = run_update(setup, state0, ro.replace(rewards=rewards))
  assert not np.isfinite(metrics["loss"])
  assert tree_equal(state.params["net"], state0.params["net"])
  assert tree_equal(state.opt_state, state0.opt_state)
  assert int(state.skipped_updates) == 1 and metrics["skipped_updates"] == 1
  assert int(state.version) == 1
  # The normaliser still takes in the (finite) observations.
  assert float(state.params["obs_norm"].count) == ro.valid.sum()
  # A later finite update goes through and the skip count stays.
  state2, metrics2 = run_update(setup, state, ro)
  assert np.isfinite(metrics2["loss"])
  assert not tree_equal(state2.params["net"], state0.params["net"])
  assert int(state2.skipped_updates) == 1 and int(state2.version) == 2


def test_invalid_samples_do_not_influence_update(setup):
  ro = setup["rollout"]
  bad = ~ro.valid
  rng = np.random.default_rng(123)
  noisy = lambda x, scale: np.where(bad.reshape(bad.shape + (1,) * (x.ndim - 2)),
                                    rng.normal(0.0, scale, x.shape), x).astype(x.dtype)
  altered = ro.replace(rewards=noisy(ro.rewards, 100.0), actions=noisy(ro.actions, 10.0),
                       logp=noisy(ro.logp, 5.0), obs={"state": noisy(ro.obs["state"], 50.0)})
  assert not np.array_equal(altered.rewards, ro.rewards)
  a, ma = run_update(setup, setup["state0"], ro)
  b, mb = run_update(setup, setup["state0"], altered)
  assert tree_equal(a.params, b.params)
  assert tree_equal(a.opt_state, b.opt_state)
  for k in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
    assert ma[k] == mb[k], k


def test_normalizer_updated_from_valid_samples_only(setup):
  ro = setup["rollout"]
  state, _ = run_update(setup, setup["state0"], ro)
  valid_obs = ro.obs["state"][ro.valid].astype(np.float64)
  assert len(valid_obs) < T * N
  stats = state.params["obs_norm"]
  np.testing.assert_allclose(stats.mean, valid_obs.mean(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(stats.var, valid_obs.var(0), rtol=1e-5, atol=1e-5)
  assert float(stats.count) == len(valid_obs)
  all_obs = ro.obs["state"].reshape(-1, OBS_DIM)
  assert np.max(np.abs(all_obs.mean(0) - valid_obs.mean(0))) > 1e-3  # the test can tell them apart
  assert int(state.version) == int(setup["state0"].version) + 1 == 1


def test_update_same_on_1_and_4_devices(tmp_path):
  script = os.path.join(ROOT, "tests", "learner_device_check.py")
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = os.environ["XLA_FLAGS"]  # conftest: XLA on the calling thread, compile-fast passes.
  env4 = {**env, "XLA_FLAGS": env["XLA_FLAGS"] + " --xla_force_host_platform_device_count=4"}
  runs = {}
  outputs = {}
  try:
    for count, e in ((1, env), (4, env4)):  # both at once: each is mostly compile time
      out = tmp_path / f"params{count}.npz"
      proc = subprocess.Popen([sys.executable, script, str(out), str(count)], env=e, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      runs[count] = (proc, out)
    for count, (proc, out) in runs.items():
      stdout, _ = proc.communicate(timeout=240)
      assert proc.returncode == 0, stdout
      lines = dict(line.split("=", 1) for line in stdout.splitlines() if line.count("=") == 1)
      outputs[count] = (lines, dict(np.load(out)))
  finally:
    for proc, _ in runs.values():
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  lines1, p1 = outputs[1]
  lines4, p4 = outputs[4]
  assert lines1["local_device_count"] == "1" and lines4["local_device_count"] == "4"
  assert lines4["rewards_sharding_devices"] == "4"
  assert lines4["rewards_shard_shapes"] == "[(8, 1)]"
  assert lines4["obs_shard_shapes"] == "[(8, 1, 5)]"
  assert lines4["params_fully_replicated"] == "True"
  assert lines1["rewards_shard_shapes"] == "[(8, 4)]"
  assert set(p1) == set(p4)
  assert float(p1["changed"]) > 1e-3  # two updates really moved the params
  for k in sorted(p1):
    np.testing.assert_allclose(p4[k], p1[k], rtol=1e-5, atol=1e-5, err_msg=k)



def test_invalid_sample_does_not_leak_into_the_one_before():
  """A forced reset (non-finite physics) marks sample t invalid without `done` at t - 1:
  the invalid sample's reward must not reach the valid sample before it."""
  spec = EnvSpec("toy", {"state": ObsSpec((3,), np.dtype(np.float32))}, 1, -np.ones(1, np.float32),
                 np.ones(1, np.float32), 10, False)
  learner = Learner(MLPPolicy(spec, hidden=(8,)),
                    LearnerConfig(epochs=1, num_minibatches=1, gamma=0.9, gae_lambda=1.0))
  t, n = 4, 1

  def rollout(invalid_reward):
    return Rollout(obs={"state": np.ones((t, n, 3), np.float32)},
                   actions=np.zeros((t, n, 1), np.float32), logp=np.zeros((t, n), np.float32),
                   values=np.zeros((t + 1, n), np.float32),
                   rewards=np.array([[1.0], [2.0], [invalid_reward], [0.5]], np.float32),
                   terminated=np.zeros((t, n), bool), done=np.array([[False], [False], [True], [False]]),
                   valid=np.array([[True], [True], [False], [True]]), version=np.zeros((t, n), np.int32))

  outs = []
  for r in (0.0, 1e6):
    new, _ = learner.update(learner.init(jax.random.PRNGKey(0)), rollout(r))
    outs.append([np.asarray(x) for x in jax.tree.leaves(new.params["net"])])
  for a, b in zip(*outs):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- KL early stopping


def _reference_steps(setup, cfg, num_steps):
  """`num_steps` full-batch Adam steps by hand (the update's epochs with one minibatch), with the
  approx KL each step measures before it is taken."""
  policy, ro = setup["policy"], setup["rollout"]
  grad_fn = jax.jit(jax.value_and_grad(lambda net, stats, b: ref_loss(net, stats, b, policy, cfg.ppo),
                                       has_aux=True))
  adv, ret = ref_gae(ro.rewards * cfg.reward_scale, ro.values, ro.terminated, ro.done, cfg.gamma, cfg.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  batch = dict(obs=ro.obs["state"].reshape(T * N, OBS_DIM), actions=ro.actions.reshape(T * N, ACTION_DIM),
               logp=ro.logp.reshape(-1), values=ro.values[:-1].reshape(-1), adv=f32(adv.reshape(-1)),
               returns=f32(ret.reshape(-1)), mask=f32(ro.valid.reshape(-1)))
  net, stats = setup["state0"].params["net"], setup["state0"].params["obs_norm"]
  treedef = jax.tree.structure(net)
  adam = NumpyAdam(jax.tree.leaves(net), cfg.learning_rate, cfg.max_grad_norm)
  nets, kls = [net], []
  for _ in range(num_steps):
    (_, metrics), grads = grad_fn(net, stats, batch)
    kls.append(float(metrics["approx_kl"]))
    leaves, _ = adam.step(jax.tree.leaves(net), jax.tree.leaves(grads))
    net = jax.tree.unflatten(treedef, [f32(x) for x in leaves])
    nets.append(net)
  return nets, kls


def test_kl_early_stop_matches_reference(setup):
  """With target_kl between the KL the 2nd and 3rd steps measure, exactly two of four steps apply
  (Stable-Baselines3's rule: stop once approx KL > 1.5 * target_kl), and the net is the reference's
  after two steps; with a huge target all four apply."""
  cfg = dataclasses.replace(CFG, epochs=4, num_minibatches=1)
  nets, kls = _reference_steps(setup, cfg, 4)
  assert kls[0] == 0.0 and 0 < kls[1] < kls[2]
  target = (kls[1] + kls[2]) / 2 / 1.5
  for target_kl, applied in ((target, 2), (1e9, 4)):
    learner = Learner(setup["policy"], dataclasses.replace(cfg, target_kl=target_kl))
    state, metrics = learner.update(device(setup["state0"]), setup["rollout"])
    state = host(state)
    assert metrics["steps_applied"] == pytest.approx(applied / 4)
    assert_tree_close(state.params["net"], nets[applied], atol=1e-6)
    # Adam's step count is the applied steps, not the scheduled ones.
    assert int(state.opt_state[1].inner_state[0].count) == applied


# ----------------------------------------------------------------------------- value normalisation


def test_value_normalised_update_matches_reference(setup):
  """The critic's outputs are standardised returns: GAE runs on unstandardised values, the value
  loss compares the critic with standardised targets, and the statistics then take in the targets
  (their history capped at value_norm_count samples)."""
  import dataclasses
  from ebrl import normalizer
  cfg = dataclasses.replace(CFG, value_norm=True, value_norm_count=30.0)
  policy, ro = setup["policy"], setup["rollout"]
  mu, var, count = 2.0, 9.0, 50.0
  stats0 = normalizer.RunningStats(np.array([mu], np.float32), np.array([var], np.float32), np.float32(count))
  state0 = setup["state0"].replace(value_norm=stats0)
  sigma = np.sqrt(var + 1e-8)
  adv, ret = ref_gae(ro.rewards * cfg.reward_scale, ro.values * sigma + mu, ro.terminated, ro.done, cfg.gamma,
                     cfg.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  batch = dict(obs=ro.obs["state"].reshape(T * N, OBS_DIM), actions=ro.actions.reshape(T * N, ACTION_DIM),
               logp=ro.logp.reshape(-1), values=ro.values[:-1].reshape(-1), adv=f32(adv.reshape(-1)),
               returns=f32(((ret - mu) / sigma).reshape(-1)), mask=f32(ro.valid.reshape(-1)))
  grad_fn = jax.value_and_grad(lambda net, stats, b: ref_loss(net, stats, b, policy, cfg.ppo), has_aux=True)
  (_, ref_metrics), grads = grad_fn(state0.params["net"], state0.params["obs_norm"], batch)
  adam = NumpyAdam(jax.tree.leaves(state0.params["net"]), cfg.learning_rate, cfg.max_grad_norm)
  leaves, _ = adam.step(jax.tree.leaves(state0.params["net"]), jax.tree.leaves(grads))
  ref_net = jax.tree.unflatten(jax.tree.structure(state0.params["net"]), [f32(x) for x in leaves])

  state, metrics = Learner(policy, cfg).update(device(state0), ro)
  state = host(state)
  assert_tree_close(state.params["net"], ref_net, atol=1e-6)
  np.testing.assert_allclose(metrics["value_loss"], float(ref_metrics["value_loss"]), rtol=1e-5)
  # Chan's merge of the prior (weighing as 30 samples) with the valid targets, in float64.
  targets = ret[ro.valid]
  n, prior = len(targets), min(count, cfg.value_norm_count)
  mean = (prior * mu + n * targets.mean()) / (prior + n)
  m2 = prior * var + n * targets.var() + (targets.mean() - mu) ** 2 * prior * n / (prior + n)
  np.testing.assert_allclose(state.value_norm.mean, [mean], rtol=1e-5)
  np.testing.assert_allclose(state.value_norm.var, [m2 / (prior + n)], rtol=1e-5)
  assert float(state.value_norm.count) == prior + n
  # The targets' scale is reported in return units.
  np.testing.assert_allclose(metrics["return_mean"], targets.mean(), rtol=1e-5)


def test_value_norm_off_keeps_the_identity(setup):
  state, metrics = run_update(setup, setup["state0"], setup["rollout"])
  np.testing.assert_array_equal(state.value_norm.mean, [0.0])
  np.testing.assert_array_equal(state.value_norm.var, [1.0])
  assert float(state.value_norm.count) == 0.0
  for k in ("grad_norm", "explained_variance", "return_std", "advantage_std", "obs_norm_shift"):
    assert np.isfinite(metrics[k]), k


@pytest.mark.parametrize("segments", [False, True])
def test_an_update_returns_the_state_types_it_took(segments):
  """Shapes, dtypes, weak types and shardings of the train state are the same after an update as
  before it, so the second update runs the first one's compiled program: a weak-typed leaf at init
  (the reward statistics' count was one) recompiled the whole update on the second call, which cost
  every run a compile and made the stage profile time a compile as an update."""
  policy = MLPPolicy(tiny_spec(), hidden=(8,))
  learner = Learner(policy, dataclasses.replace(CFG, reward_norm=True, num_envs=N))
  state = learner.init(jax.random.key(0))
  ro = make_rollout(policy, host(state).params, seed=1)
  if segments:
    obs = {"state": np.concatenate([ro.obs["state"], ro.obs["state"][-1:]])}
    batch = SegmentBatch(obs=obs, actions=ro.actions, logp=ro.logp, rewards=ro.rewards, terminated=ro.terminated,
                         done=ro.done, valid=ro.valid, version=ro.version)
    new, _ = learner.update_segments(state, batch)
  else:
    new, _ = learner.update(state, ro)
  kinds = lambda s: [(jax.tree_util.keystr(p), x.shape, x.dtype, jax.typeof(x).weak_type, str(x.sharding))
                     for p, x in jax.tree_util.tree_flatten_with_path(s)[0]]
  assert kinds(new) == kinds(state)

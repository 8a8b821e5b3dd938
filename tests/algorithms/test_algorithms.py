"""Numerical checks of GAE, V-trace, the PPO loss, the Gaussian head and the normaliser.

Every check compares the library against an independent reference written here
in NumPy (float64), or against exact hand-computed numbers.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from ebrl import normalizer
from ebrl.algorithms.gae import gae
from ebrl.algorithms.ppo import PPOConfig, ppo_loss
from ebrl.algorithms.vtrace import vtrace
from policies.mlp import gaussian_entropy, gaussian_logp

# ----------------------------------------------------------------------------- GAE


def np_gae(rewards, values, terminated, truncated, gamma, lam):
  """Backward loop over t, written from the textbook definition."""
  rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
  t_len, n = rewards.shape
  adv = np.zeros((t_len, n))
  for j in range(n):
    next_adv = 0.0
    for t in reversed(range(t_len)):
      done = terminated[t, j] or truncated[t, j]
      bootstrap = 0.0 if terminated[t, j] else gamma * values[t + 1, j]
      delta = rewards[t, j] + bootstrap - values[t, j]
      next_adv = delta + (0.0 if done else gamma * lam * next_adv)
      adv[t, j] = next_adv
  return adv, adv + values[:-1]


@pytest.fixture(scope="module")
def gae_fn():
  return jax.jit(gae, static_argnames=("gamma", "lam"))


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 1.0), (0.8, 0.0)])
def test_gae_matches_numpy_reference(gae_fn, gamma, lam):
  rng = np.random.default_rng(0)
  t_len, n = 16, 6
  rewards = rng.normal(size=(t_len, n)).astype(np.float32)
  values = rng.normal(size=(t_len + 1, n)).astype(np.float32)
  terminated = rng.random((t_len, n)) < 0.15
  truncated = (rng.random((t_len, n)) < 0.15) & ~terminated
  assert terminated.any() and truncated.any()
  done = terminated | truncated
  adv, ret = gae_fn(rewards, values, terminated, done, gamma=gamma, lam=lam)
  ref_adv, ref_ret = np_gae(rewards, values, terminated, truncated, gamma, lam)
  assert adv.shape == ret.shape == (t_len, n)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_hand_computed(gae_fn):
  # T=3, gamma=0.5, lam=1; column 0: no boundary, column 1: terminated at t=1,
  # column 2: truncated at t=1 (bootstraps values[2] = 3, stops propagation).
  rewards = np.array([[1.0] * 3, [2.0] * 3, [3.0] * 3], np.float32)
  values = np.array([[1.0] * 3, [2.0] * 3, [3.0] * 3, [4.0] * 3], np.float32)
  terminated = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], bool)
  done = np.array([[0, 0, 0], [0, 1, 1], [0, 0, 0]], bool)
  adv, ret = gae_fn(rewards, values, terminated, done, gamma=0.5, lam=1.0)
  # Column 0: deltas (1, 1.5, 2) -> adv (2.25, 2.5, 2); returns = 1 + .5*2 + .25*3 + .125*4.
  # Column 1: deltas (1, 0, 2) -> adv (1, 0, 2).
  # Column 2: deltas (1, 1.5, 2) -> adv (1.75, 1.5, 2).
  np.testing.assert_array_equal(adv, [[2.25, 1.0, 1.75], [2.5, 0.0, 1.5], [2.0, 2.0, 2.0]])
  np.testing.assert_array_equal(ret, [[3.25, 2.0, 2.75], [4.5, 2.0, 3.5], [5.0, 5.0, 5.0]])


def test_gae_lambda_one_is_discounted_return(gae_fn):
  # With lam=1 and no boundaries the return target is the bootstrapped discounted reward sum.
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(5, 2)).astype(np.float32)
  values = rng.normal(size=(6, 2)).astype(np.float32)
  no = np.zeros((5, 2), bool)
  _, ret = gae_fn(rewards, values, no, no, gamma=0.9, lam=1.0)
  disc = 0.9 ** np.arange(5)
  expected = [np.sum(disc[:5 - t, None] * rewards[t:], 0) + 0.9 ** (5 - t) * values[5] for t in range(5)]
  np.testing.assert_allclose(ret, np.stack(expected), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- V-trace


def np_vtrace(rewards, values, terminated, cut, log_rho, gamma, lam, rho_clip, c_clip):
  """IMPALA's sum form: vs_s = V_s + sum_t gamma^(t-s) (prod_{i<t} c_i) delta_t, up to a cut."""
  rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
  ratio = np.exp(np.asarray(log_rho, np.float64))
  rho, c = np.minimum(rho_clip, ratio), lam * np.minimum(c_clip, ratio)
  t_len, n = rewards.shape
  vs, adv = np.zeros((t_len, n)), np.zeros((t_len, n))
  for j in range(n):
    delta = [rho[t, j] * (rewards[t, j] + (0.0 if terminated[t, j] else gamma * values[t + 1, j]) - values[t, j])
             for t in range(t_len)]
    for s in range(t_len):
      total, coef = 0.0, 1.0
      for t in range(s, t_len):
        total += coef * delta[t]
        if cut[t, j]:
          break
        coef *= gamma * c[t, j]
      vs[s, j] = values[s, j] + total
    for s in range(t_len):
      nxt = values[s + 1, j] if (cut[s, j] or s == t_len - 1) else vs[s + 1, j]
      boot = 0.0 if terminated[s, j] else gamma * nxt
      adv[s, j] = rho[s, j] * (rewards[s, j] + boot - values[s, j])
  return adv, vs


@pytest.fixture(scope="module")
def vtrace_fn():
  return jax.jit(vtrace, static_argnames=("gamma", "lam", "rho_clip", "c_clip"))


@pytest.mark.parametrize("gamma,lam,rho_clip,c_clip", [(0.99, 0.95, 1.0, 1.0), (0.9, 1.0, 2.0, 0.5)])
def test_vtrace_matches_numpy_reference(vtrace_fn, gamma, lam, rho_clip, c_clip):
  rng = np.random.default_rng(2)
  t_len, n = 12, 5
  rewards = rng.normal(size=(t_len, n)).astype(np.float32)
  values = rng.normal(size=(t_len + 1, n)).astype(np.float32)
  terminated = rng.random((t_len, n)) < 0.15
  cut = terminated | (rng.random((t_len, n)) < 0.15)
  log_rho = rng.normal(scale=0.7, size=(t_len, n)).astype(np.float32)
  assert (np.exp(log_rho) > max(rho_clip, c_clip)).any() and terminated.any() and (cut & ~terminated).any()
  adv, vs = vtrace_fn(rewards, values, terminated, cut, log_rho, gamma=gamma, lam=lam, rho_clip=rho_clip,
                      c_clip=c_clip)
  ref_adv, ref_vs = np_vtrace(rewards, values, terminated, cut, log_rho, gamma, lam, rho_clip, c_clip)
  np.testing.assert_allclose(vs, ref_vs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)


def test_vtrace_on_policy_targets_are_gae_returns(vtrace_fn, gae_fn):
  rng = np.random.default_rng(3)
  rewards = rng.normal(size=(10, 4)).astype(np.float32)
  values = rng.normal(size=(11, 4)).astype(np.float32)
  terminated = rng.random((10, 4)) < 0.1
  done = terminated | (rng.random((10, 4)) < 0.1)
  _, vs = vtrace_fn(rewards, values, terminated, done, np.zeros((10, 4), np.float32), gamma=0.97, lam=0.9,
                    rho_clip=1.0, c_clip=1.0)
  _, ret = gae_fn(rewards, values, terminated, done, gamma=0.97, lam=0.9)
  np.testing.assert_allclose(vs, ret, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- PPO


def np_ppo(cfg, logp, entropy, value, old_logp, old_value, advantages, returns, mask):
  f64 = lambda x: np.asarray(x, np.float64)
  logp, entropy, value, old_logp, old_value, adv, returns = map(
      f64, (logp, entropy, value, old_logp, old_value, advantages, returns))
  sel = np.asarray(mask) > 0
  if cfg.normalize_advantages:
    a = adv[sel]
    adv = (adv - a.mean()) / (a.std() + 1e-8)  # population std over valid samples
  ratio = np.exp(logp - old_logp)
  unclipped = ratio * adv
  clipped = np.clip(ratio, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv
  pg = -np.minimum(unclipped, clipped)
  v_err = (value - returns) ** 2
  if cfg.value_clip_eps > 0:
    v_clip = old_value + np.clip(value - old_value, -cfg.value_clip_eps, cfg.value_clip_eps)
    v_err = np.maximum(v_err, (v_clip - returns) ** 2)
  policy_loss = pg[sel].mean()
  value_loss = 0.5 * v_err[sel].mean()
  ent = entropy[sel].mean()
  log_ratio = logp - old_logp
  metrics = dict(
      policy_loss=policy_loss,
      value_loss=value_loss,
      entropy=ent,
      approx_kl=(ratio[sel] - 1.0 - log_ratio[sel]).mean(),
      clip_fraction=(np.abs(ratio[sel] - 1.0) > cfg.clip_eps).mean(),
  )
  loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * ent
  return loss, metrics


def ppo_inputs(seed, b=64):
  rng = np.random.default_rng(seed)
  f32 = lambda x: np.asarray(x, np.float32)
  old_logp = f32(rng.normal(-2.0, 1.0, b))
  logp = f32(old_logp + rng.normal(0.0, 0.3, b))  # many ratios outside [0.8, 1.2]
  old_value = f32(rng.normal(0.0, 1.0, b))
  value = f32(old_value + rng.normal(0.0, 0.5, b))
  return dict(logp=logp, entropy=f32(rng.normal(1.0, 0.2, b)), value=value, old_logp=old_logp,
              old_value=old_value, advantages=f32(rng.normal(0.5, 2.0, b)),
              returns=f32(rng.normal(0.0, 1.5, b)), mask=f32(rng.random(b) < 0.7))


_CONFIGS = {
    "plain": PPOConfig(value_clip_eps=0.0, normalize_advantages=False, ent_coef=0.01),
    "norm": PPOConfig(value_clip_eps=0.0, normalize_advantages=True),
    "vclip": PPOConfig(value_clip_eps=0.2, normalize_advantages=False, vf_coef=0.7),
    "vclip_norm": PPOConfig(clip_eps=0.1, value_clip_eps=0.3, normalize_advantages=True, ent_coef=0.05),
}


@pytest.fixture(scope="module")
def ppo_fns():
  return {name: jax.jit(functools.partial(ppo_loss, cfg)) for name, cfg in _CONFIGS.items()}


def _check_ppo(out, ref):
  loss, metrics = out
  ref_loss, ref_metrics = ref
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
  assert set(metrics) == set(ref_metrics)
  for k, v in ref_metrics.items():
    np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_ppo_loss_matches_numpy_reference(ppo_fns, name):
  cfg = _CONFIGS[name]
  x = ppo_inputs(seed=3)
  ref = np_ppo(cfg, **x)
  # The data really exercises the clipped branches.
  assert 0.1 < ref[1]["clip_fraction"] < 0.9
  if cfg.value_clip_eps > 0:
    no_vclip = np_ppo(dataclasses.replace(cfg, value_clip_eps=0.0), **x)
    assert ref[1]["value_loss"] > no_vclip[1]["value_loss"] + 1e-3
  _check_ppo(ppo_fns[name](**x), ref)


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_ppo_loss_ignores_masked_samples(ppo_fns, name):
  x = ppo_inputs(seed=4)
  rng = np.random.default_rng(5)
  out = (x["mask"] == 0)
  assert out.sum() > 5
  y = dict(x)
  for k, scale in [("logp", 5.0), ("old_logp", 5.0), ("entropy", 100.0), ("value", 100.0),
                   ("old_value", 100.0), ("advantages", 1000.0), ("returns", 100.0)]:
    y[k] = np.where(out, rng.normal(0.0, scale, out.shape), x[k]).astype(np.float32)
  a, b = ppo_fns[name](**x), ppo_fns[name](**y)
  np.testing.assert_array_equal(a[0], b[0])
  for k in a[1]:
    np.testing.assert_array_equal(a[1][k], b[1][k], err_msg=k)
  # ... and equals the loss over the valid samples alone.
  sel = ~out
  sub = {k: v[sel] for k, v in x.items()}
  _check_ppo(a, np_ppo(_CONFIGS[name], **sub))


def test_ppo_loss_all_masked_is_zero(ppo_fns):
  x = ppo_inputs(seed=6)
  x["mask"] = np.zeros_like(x["mask"])
  loss, metrics = ppo_fns["vclip_norm"](**x)
  assert float(loss) == 0.0
  for k, v in metrics.items():
    assert float(v) == 0.0, k


def test_ppo_ratio_one_gives_zero_kl_and_no_clipping(ppo_fns):
  x = ppo_inputs(seed=7)
  x["logp"] = x["old_logp"]
  loss, metrics = ppo_fns["norm"](**x)
  assert float(metrics["approx_kl"]) == 0.0
  assert float(metrics["clip_fraction"]) == 0.0
  # Normalised advantages have zero mean over valid samples, so the policy term is ~0.
  np.testing.assert_allclose(metrics["policy_loss"], 0.0, atol=1e-6)


# ----------------------------------------------------------------------------- Gaussian head


def test_gaussian_logp_and_entropy_match_scipy():
  rng = np.random.default_rng(8)
  b, a = 7, 3
  mean = rng.normal(size=(b, a)).astype(np.float32)
  log_std = rng.normal(-0.5, 0.6, size=(a,)).astype(np.float32)
  action = (mean + rng.normal(size=(b, a)) * 2.0).astype(np.float32)
  std = np.exp(log_std.astype(np.float64))
  ref_logp = sps.norm.logpdf(action.astype(np.float64), loc=mean.astype(np.float64), scale=std).sum(-1)
  mvn = [sps.multivariate_normal(mean[i].astype(np.float64), np.diag(std ** 2)) for i in range(b)]
  ref_logp_mvn = np.array([m.logpdf(action[i].astype(np.float64)) for i, m in enumerate(mvn)])
  np.testing.assert_allclose(ref_logp, ref_logp_mvn, rtol=1e-10)

  logp = gaussian_logp(jnp.asarray(action), jnp.asarray(mean), jnp.asarray(log_std))
  assert logp.shape == (b,)
  np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)

  ent = gaussian_entropy(jnp.asarray(log_std), (2, b))
  assert ent.shape == (2, b)
  ref_ent = sps.norm.entropy(scale=std).sum()
  np.testing.assert_allclose(ref_ent, mvn[0].entropy(), rtol=1e-10)
  np.testing.assert_allclose(ent, np.full((2, b), ref_ent), rtol=1e-6, atol=1e-6)


def test_gaussian_logp_broadcasts_batch_dims():
  rng = np.random.default_rng(9)
  mean = rng.normal(size=(4, 5, 2)).astype(np.float32)
  log_std = np.array([0.3, -1.2], np.float32)
  action = rng.normal(size=(4, 5, 2)).astype(np.float32)
  logp = gaussian_logp(jnp.asarray(action), jnp.asarray(mean), jnp.asarray(log_std))
  ref = sps.norm.logpdf(action.astype(np.float64), loc=mean.astype(np.float64),
                        scale=np.exp(log_std.astype(np.float64))).sum(-1)
  assert logp.shape == (4, 5)
  np.testing.assert_allclose(logp, ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- normaliser


@pytest.fixture(scope="module")
def update_fn():
  return jax.jit(normalizer.update_stats)


def test_update_stats_matches_numpy_over_weighted_rows(update_fn):
  rng = np.random.default_rng(10)
  d = 5
  stats = normalizer.init_stats(d)
  rows = []
  for i in range(4):
    x = (rng.normal(size=(3, 4, d)) * rng.uniform(0.5, 3.0, d) + rng.uniform(-4, 4, d)).astype(np.float32)
    w = rng.random((3, 4)) < 0.6
    if i == 2:
      w[:] = False  # a batch with no valid rows leaves the statistics alone
    before = stats
    stats = update_fn(stats, x, w)
    if i == 2:
      for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(stats)):
        np.testing.assert_array_equal(a, b)
    rows.append(x.reshape(-1, d)[w.reshape(-1)])
    # The statistics after every batch equal those of all weighted-in rows so far.
    allx = np.concatenate(rows).astype(np.float64)
    np.testing.assert_allclose(stats.mean, allx.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.var, allx.var(0), rtol=1e-5, atol=1e-5)
    assert float(stats.count) == allx.shape[0]
  # Rows of an unweighted update all count.
  x = rng.normal(2.0, 0.5, size=(6, d)).astype(np.float32)
  stats = jax.jit(normalizer.update_stats)(stats, x)
  allx = np.concatenate(rows + [x]).astype(np.float64)
  np.testing.assert_allclose(stats.mean, allx.mean(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(stats.var, allx.var(0), rtol=1e-5, atol=1e-5)
  assert float(stats.count) == allx.shape[0]


def test_update_stats_single_rows_equal_one_batch(update_fn):
  rng = np.random.default_rng(11)
  x = rng.normal(1.0, 2.0, size=(12, 3)).astype(np.float32)
  w = np.ones(1, bool)
  one_by_one = normalizer.init_stats(3)
  for row in x:
    one_by_one = update_fn(one_by_one, row[None], w)
  batch = update_fn(normalizer.init_stats(3), x[:, None], np.ones((12, 1), bool))
  np.testing.assert_allclose(one_by_one.mean, batch.mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(one_by_one.var, batch.var, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(batch.var, x.astype(np.float64).var(0), rtol=1e-5)


def test_normalize_standardises_and_clips():
  mean = np.array([0.0, 1.0, -2.0, 0.5], np.float32)
  var = np.array([1.0, 4.0, 1e-4, 0.25], np.float32)
  stats = normalizer.RunningStats(jnp.asarray(mean), jnp.asarray(var), jnp.asarray(10.0))
  x = np.array([[0.5, 3.0, -2.0005, 0.0],
                [50.0, -100.0, -1.0, 0.75],
                [-11.0, 1.0, -3.0, 100.0]], np.float32)
  ref = (x.astype(np.float64) - mean) / np.sqrt(var.astype(np.float64) + 1e-8)
  out = np.asarray(normalizer.normalize(stats, jnp.asarray(x)))
  np.testing.assert_allclose(out, np.clip(ref, -10.0, 10.0), rtol=1e-5, atol=1e-5)
  assert out.max() == 10.0 and out.min() == -10.0
  assert (np.abs(ref) > 10).sum() >= 4  # several entries really were clipped
  out5 = np.asarray(normalizer.normalize(stats, jnp.asarray(x), clip=5.0))
  np.testing.assert_allclose(out5, np.clip(ref, -5.0, 5.0), rtol=1e-5, atol=1e-5)


def test_update_stats_with_max_count_weighs_history_as_that_many_samples():
  """max_count = M: each merge treats the earlier statistics as min(count, M) samples, so a
  drifting quantity is followed; a NumPy recursion of the same weighted merge is the reference."""
  rng = np.random.default_rng(12)
  update = jax.jit(normalizer.update_stats, static_argnames="max_count")
  stats = normalizer.init_stats(2)
  mean, var, count = np.zeros(2), np.ones(2), 0.0
  for i in range(6):
    x = rng.normal(3.0 * i, 1.0 + i, size=(8, 2))  # The mean and spread keep moving.
    stats = update(stats, x.astype(np.float32), max_count=20.0)
    prior, n = min(count, 20.0), len(x)
    bm, bv = x.mean(0), x.var(0)
    delta = bm - mean
    mean = mean + delta * n / (prior + n)
    var = (var * prior + bv * n + delta ** 2 * prior * n / (prior + n)) / (prior + n)
    count = prior + n
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.var, var, rtol=1e-5, atol=1e-5)
    assert float(stats.count) == count
  # Capped history follows the drift; an uncapped one lags behind it.
  full = normalizer.init_stats(2)
  rng = np.random.default_rng(12)
  for i in range(6):
    full = update(full, rng.normal(3.0 * i, 1.0 + i, size=(8, 2)).astype(np.float32), max_count=None)
  assert np.all(np.asarray(stats.mean) > np.asarray(full.mean) + 1.0)


def test_standardize_and_unstandardize_are_inverse():
  stats = normalizer.RunningStats(jnp.asarray([4.0]), jnp.asarray([16.0]), jnp.asarray(5.0))
  y = np.array([-1.0, 0.0, 2.5], np.float32)
  x = normalizer.unstandardize(stats, y)
  np.testing.assert_allclose(x, y * 4.0 + 4.0, rtol=1e-6)
  np.testing.assert_allclose(normalizer.standardize(stats, x), y, rtol=1e-6, atol=1e-6)
  # Initial statistics (the value normaliser switched off) are the identity.
  init = normalizer.init_stats(1)
  np.testing.assert_allclose(normalizer.unstandardize(init, y), y, rtol=1e-7)


# ----------------------------------------------------------------------------- PPO over action tokens


def np_ppo_tokens(cfg, logp, old_logp, advantages, mask, behaviour_logp):
  """Per-token ratios, written per sample and token from the definition: each token's clipped
  surrogate with its decision's (normalised) advantage, averaged over the decision's tokens, times
  the decision's capped behaviour weight prox / behaviour; KL and clip fraction per token."""
  logp, old_logp = np.asarray(logp, np.float64), np.asarray(old_logp, np.float64)
  adv = np.asarray(advantages, np.float64)
  valid = [j for j in range(len(adv)) if mask[j] > 0]
  a = adv[valid]
  adv = (adv - a.mean()) / (a.std() + 1e-8)
  pg, kl, clipped = [], [], []
  for j in valid:
    weight = min(np.exp(old_logp[j].sum() - behaviour_logp[j]), cfg.behaviour_weight_clip)
    terms, kls, clips = [], [], []
    for i in range(logp.shape[1]):
      r = np.exp(logp[j, i] - old_logp[j, i])
      terms.append(-min(r * adv[j], np.clip(r, 1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv[j]))
      kls.append(r - 1 - (logp[j, i] - old_logp[j, i]))
      clips.append(abs(r - 1) > cfg.clip_eps)
    pg.append(weight * np.mean(terms))
    kl.append(np.mean(kls))
    clipped.append(np.mean(clips))
  return np.mean(pg), np.mean(kl), np.mean(clipped)


def test_ppo_loss_per_token_matches_numpy_reference():
  cfg = PPOConfig(value_clip_eps=0.0, normalize_advantages=True, behaviour_weight_clip=1.5)
  x = ppo_inputs(seed=8)
  rng = np.random.default_rng(9)
  old_tokens = (rng.normal(-3.0, 1.0, (64, 6))).astype(np.float32)
  tokens = (old_tokens + rng.normal(0.0, 0.3, old_tokens.shape)).astype(np.float32)
  behaviour = (old_tokens.sum(-1) + rng.normal(0.0, 0.5, 64)).astype(np.float32)  # Some weights capped.
  _, metrics = jax.jit(functools.partial(ppo_loss, cfg))(
      **{**x, "logp": tokens, "old_logp": old_tokens}, behaviour_logp=behaviour)
  ref_pg, ref_kl, ref_clip = np_ppo_tokens(cfg, tokens, old_tokens, x["advantages"], x["mask"], behaviour)
  assert 0.1 < ref_clip < 0.9  # Both branches of the clip are exercised.
  np.testing.assert_allclose(metrics["policy_loss"], ref_pg, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["approx_kl"], ref_kl, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(metrics["clip_fraction"], ref_clip, rtol=1e-6)


def test_ppo_loss_over_one_token_is_the_decision_loss(ppo_fns):
  x = ppo_inputs(seed=10)
  per_decision = ppo_fns["vclip_norm"](**x)
  per_token = ppo_fns["vclip_norm"](**{**x, "logp": x["logp"][:, None], "old_logp": x["old_logp"][:, None]})
  _check_ppo(per_token, (float(per_decision[0]), {k: float(v) for k, v in per_decision[1].items()}))

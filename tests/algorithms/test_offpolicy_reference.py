"""Off-policy numerics of `Learner.update_segments` against a float64 reference.

On-policy data hides the off-policy corrections: the behaviour weight is 1 and
log rho is 0, so an inverted ratio or a swapped log-prob still gives the right
update. Here the behaviour log-probs differ from the proximal policy's (the
params the update starts from), some samples are too stale to use, and the
reference recomputes one update (epochs=1, one minibatch, so one Adam step):

- proximal log-probs and values from `policy.evaluate` on the starting params
  in float64;
- GAE (decoupled PPO) or V-trace (IMPALA's sums, not the library's recursion)
  in NumPy;
- the loss in terms defined here, differentiated with jax.grad through
  `policy.evaluate` in float64, then one step of the learner's own optimiser
  (`make_optimizer`).

Adam's first step is lr * g / (|g| + eps) per parameter: about lr * sign(g)
when |g| >> eps, which would only check the gradient's signs. The gradient is
therefore clipped to a global norm of ~eps * sqrt(#params), where the step is
close to proportional to the gradient, so the new params carry its direction.
Each reference check also shows that a plausible mistake (behaviour and
proximal swapped, the ratio inverted, log rho negated, ...) lands far away.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ebrl import normalizer
from ebrl.algorithms.ppo import PPOConfig
from ebrl.learner import Learner, LearnerConfig, make_optimizer
from ebrl.types import SegmentBatch
from policies.mlp import MLPPolicy
from sim_adapters.base import EnvSpec, ObsSpec

T, B, OBS_DIM, ACTION_DIM = 6, 4, 3, 2
LEARNER_VERSION = 3  # Samples of version 2 are exactly max_staleness old, of version 1 too stale.

BASE = LearnerConfig(gamma=0.9, gae_lambda=0.8, epochs=1, num_minibatches=1, learning_rate=1e-2,
                     max_grad_norm=1e-4, reward_scale=1.5, max_staleness=1, vtrace_rho_clip=1.2,
                     vtrace_c_clip=0.9,
                     ppo=PPOConfig(clip_eps=0.2, value_clip_eps=0.0, vf_coef=0.5, ent_coef=0.01,
                                   normalize_advantages=True, behaviour_weight_clip=1.5))
CONFIGS = {
    "decoupled_ppo": dataclasses.replace(BASE, correction="decoupled_ppo"),
    "decoupled_ppo_raw_adv": dataclasses.replace(
        BASE, correction="decoupled_ppo", ppo=dataclasses.replace(BASE.ppo, normalize_advantages=False)),
    "vtrace": dataclasses.replace(BASE, correction="vtrace"),
}
# Far below how far a wrong correction moves the params (checked per test).
ATOL = 1e-6


@pytest.fixture(scope="module", autouse=True)
def _full_precision_matmuls():
  # No effect on CPU; on a GPU it keeps float32 matmuls out of TF32.
  with jax.default_matmul_precision("highest"):
    yield


def tiny_spec() -> EnvSpec:
  return EnvSpec(name="tiny", obs={"state": ObsSpec((OBS_DIM,), np.dtype(np.float32))}, action_dim=ACTION_DIM,
                 action_low=-np.ones(ACTION_DIM, np.float32), action_high=np.ones(ACTION_DIM, np.float32),
                 max_episode_steps=10, has_success=False)


def host(tree):
  """A NumPy copy (the learner donates its input state)."""
  return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def device(tree):
  return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


def leaves_equal(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def max_diff(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def setup():
  """One policy, one starting state and one Learner per config, shared so each compiles once."""
  policy = MLPPolicy(tiny_spec(), hidden=(8,))
  learners = {name: Learner(policy, cfg) for name, cfg in CONFIGS.items()}
  state = learners["decoupled_ppo"].init(jax.random.PRNGKey(0))
  # Non-trivial observation statistics, so the reference must normalise like the learner.
  rng = np.random.default_rng(7)
  stats = normalizer.RunningStats(mean=rng.normal(0.5, 0.3, OBS_DIM).astype(np.float32),
                                  var=rng.uniform(0.5, 2.0, OBS_DIM).astype(np.float32),
                                  count=np.float32(50.0))
  state = state.replace(params={**state.params, "obs_norm": stats},
                        version=jnp.asarray(LEARNER_VERSION, jnp.int32))
  state0 = host(state)
  return dict(policy=policy, learners=learners, state0=state0, batch=make_batch(policy, state0.params, seed=0),
              evaluate=jax.jit(policy.evaluate), reference_step=make_reference_step(policy))


def make_batch(policy: MLPPolicy, params, seed: int) -> SegmentBatch:
  """Segments whose behaviour log-probs are the proximal ones plus noise.

  Versions only grow along a segment (the actor picks up newer params), so the
  too-stale samples are each segment's first ones. Segment 0 starts with two
  stale samples, then samples exactly max_staleness old; segment 1 holds a
  truncation followed by an (invalid) automatic-reset step; segment 2 a
  termination and one stale sample that is invalid anyway.
  """
  rng = np.random.default_rng(seed)
  obs = rng.normal(0.5, 1.5, (T + 1, B, OBS_DIM)).astype(np.float32)
  actions = rng.normal(0.0, 0.8, (T, B, ACTION_DIM)).astype(np.float32)
  version = np.full((T, B), LEARNER_VERSION, np.int32)
  version[:2, 0], version[2:, 0] = 1, 2
  version[:2, 2] = 1
  version[:, 3] = 2
  valid = np.ones((T, B), bool)
  terminated = np.zeros((T, B), bool)
  done = np.zeros((T, B), bool)
  done[2, 1] = True  # truncated: bootstraps from obs[3]
  valid[3, 1] = False  # the automatic reset after it
  terminated[4, 2] = done[4, 2] = True
  valid[5, 2] = False
  valid[0, 2] = False  # stale and invalid: not counted as dropped
  prox_logp = np.asarray(jax.jit(policy.evaluate)(params, {"state": obs[:T]}, actions)[0])
  # Both directions, and far enough for the behaviour weight clip and V-trace's clips to act.
  logp = (prox_logp + rng.normal(0.0, 0.6, (T, B))).astype(np.float32)
  rewards = rng.normal(0.0, 1.0, (T, B)).astype(np.float32)
  return SegmentBatch(obs={"state": obs}, actions=actions, logp=logp, rewards=rewards, terminated=terminated,
                      done=done, valid=valid, version=version)


def run_update(setup, name: str, batch: SegmentBatch):
  new_state, metrics = setup["learners"][name].update_segments(device(setup["state0"]), batch)
  return host(new_state), {k: np.asarray(v) for k, v in metrics.items()}


# ----------------------------------------------------------------------------- reference


def np_gae(rewards, values, terminated, cut, gamma, lam):
  """A_t = sum_k (gamma lam)^k delta_{t+k}, stopped after the first cut."""
  adv = np.zeros(rewards.shape)
  for j in range(rewards.shape[1]):
    for s in range(rewards.shape[0]):
      total, scale = 0.0, 1.0
      for t in range(s, rewards.shape[0]):
        bootstrap = 0.0 if terminated[t, j] else gamma * values[t + 1, j]
        total += scale * (rewards[t, j] + bootstrap - values[t, j])
        if cut[t, j]:
          break
        scale *= gamma * lam
      adv[s, j] = total
  return adv, adv + values[:-1]


def np_vtrace(rewards, values, terminated, cut, log_rho, gamma, lam, rho_clip, c_clip):
  """IMPALA (Espeholt et al. 2018, eq. 1): the n-step sums, with lambda in c_i.

  vs_s = V(x_s) + sum_t gamma^(t-s) (prod_{i<t} c_i) delta_t, stopped after a cut;
  A_s = rho_s (r_s + gamma v_{s+1} - V(x_s)) with v_{s+1} = vs_{s+1}, or V(x_{s+1})
  where s is cut (a truncation or an unusable next sample); nothing after a termination.
  """
  ratio = np.exp(log_rho)
  rho, c = np.minimum(rho_clip, ratio), lam * np.minimum(c_clip, ratio)
  t_len, n = rewards.shape
  vs = np.zeros((t_len, n))
  adv = np.zeros((t_len, n))
  for j in range(n):
    for s in range(t_len):
      total, scale = 0.0, 1.0
      for t in range(s, t_len):
        bootstrap = 0.0 if terminated[t, j] else gamma * values[t + 1, j]
        total += scale * rho[t, j] * (rewards[t, j] + bootstrap - values[t, j])
        if cut[t, j]:
          break
        scale *= gamma * c[t, j]
      vs[s, j] = values[s, j] + total
  for j in range(n):
    for s in range(t_len):
      following = values[s + 1, j] if (cut[s, j] or s == t_len - 1) else vs[s + 1, j]
      bootstrap = 0.0 if terminated[s, j] else gamma * following
      adv[s, j] = rho[s, j] * (rewards[s, j] + bootstrap - values[s, j])
  return adv, vs


def make_reference_step(policy: MLPPolicy):
  """jit(cfg, params, data) -> (net after one optimiser step, metrics), in float64 under enable_x64.

  Compiled once per config; the data (fixed in NumPy by `reference_update`) enters as arguments.
  """

  def step(cfg: LearnerConfig, params, data):
    ppo = cfg.ppo

    def loss_fn(net):
      logp, entropy, value = policy.evaluate({**params, "net": net}, {"state": data["obs"]}, data["actions"])
      ratio = jnp.exp(data["sign"] * (logp - data["old_logp"]))
      adv, w = data["adv"], data["w"]
      surrogate = jnp.where(adv >= 0, jnp.minimum(ratio, 1 + ppo.clip_eps), jnp.maximum(ratio, 1 - ppo.clip_eps)) * adv
      policy_loss = -jnp.sum(w * data["weight"] * surrogate)  # the weight is data: no gradient through it
      value_loss = 0.5 * jnp.sum(w * (value - data["returns"]) ** 2)
      loss = policy_loss + ppo.vf_coef * value_loss - ppo.ent_coef * jnp.sum(w * entropy)
      return loss, dict(policy_loss=policy_loss, value_loss=value_loss,
                        clip_fraction=jnp.sum(w * (jnp.abs(ratio - 1) > ppo.clip_eps)))

    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params["net"])
    optimizer = make_optimizer(cfg)
    updates, _ = optimizer.update(grads, optimizer.init(params["net"]), params["net"])
    return optax.apply_updates(params["net"], updates), {**metrics, "loss": loss, "grad_norm": optax.global_norm(grads)}

  return jax.jit(step, static_argnums=0)


def reference_update(setup, params, sb: SegmentBatch, cfg: LearnerConfig, mistake: str | None = None):
  """One learner update of `sb` from `params`, in float64; returns (net, metrics).

  `mistake` injects one plausible bug, to show the comparison can tell.
  """
  ppo = cfg.ppo
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params)
    obs = sb.obs["state"].astype(np.float64)
    actions = np.concatenate([sb.actions, np.zeros((1, B, ACTION_DIM), np.float32)]).astype(np.float64)
    prox, _, values = (np.asarray(x) for x in setup["evaluate"](p64, {"state": obs}, actions))
    prox = prox[:T]
    behaviour = sb.logp.astype(np.float64)
    valid = sb.valid & (LEARNER_VERSION - sb.version <= cfg.max_staleness)
    next_valid = np.concatenate([valid[1:], np.ones((1, B), bool)])
    cut = sb.done | ~next_valid
    rewards = sb.rewards.astype(np.float64) * cfg.reward_scale
    if cfg.correction == "vtrace":
      log_rho = behaviour - prox if mistake == "log_rho_negated" else prox - behaviour
      adv, returns = np_vtrace(rewards, values, sb.terminated, cut, log_rho, cfg.gamma, cfg.gae_lambda,
                               cfg.vtrace_rho_clip, cfg.vtrace_c_clip)
      # APPO: the PPO ratio is against the behaviour policy, with no extra weight.
      old_logp = prox if mistake == "ratio_vs_proximal" else behaviour
      weight = np.ones((T, B))
    else:
      adv, returns = np_gae(rewards, values, sb.terminated, cut, cfg.gamma, cfg.gae_lambda)
      old_logp = prox
      log_w = {"swapped": behaviour - prox, "no_weight": np.zeros((T, B))}.get(mistake, prox - behaviour)
      weight = np.minimum(np.exp(log_w), ppo.behaviour_weight_clip)
    mask = valid.astype(np.float64)
    w = mask / mask.sum()
    if ppo.normalize_advantages:
      mean = np.sum(w * adv)
      adv = (adv - mean) / (np.sqrt(np.sum(w * (adv - mean) ** 2)) + 1e-8)
    data = dict(obs=obs[:T], actions=actions[:T], old_logp=old_logp, weight=weight, adv=adv, returns=returns, w=w,
                sign=np.float64(-1.0 if mistake == "ratio_inverted" else 1.0))
    net, metrics = setup["reference_step"](cfg, p64, data)
    return host(net), {k: float(v) for k, v in metrics.items()}


def check_against_reference(setup, name: str, mistakes: tuple[str, ...]):
  cfg = CONFIGS[name]
  state0, sb = setup["state0"], setup["batch"]
  state, metrics = run_update(setup, name, sb)
  ref_net, ref = reference_update(setup, state0.params, sb, cfg)
  # A real step: the raw gradient was clipped, and params moved by up to ~lr.
  assert ref["grad_norm"] > 100 * cfg.max_grad_norm
  moved = max_diff(state.params["net"], state0.params["net"])
  assert moved > 0.3 * cfg.learning_rate
  assert max_diff(state.params["net"], ref_net) < ATOL
  for k in ("loss", "policy_loss", "value_loss", "clip_fraction"):
    np.testing.assert_allclose(metrics[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
  assert int(metrics["stale_dropped"]) == 3
  for mistake in mistakes:
    wrong_net, _ = reference_update(setup, state0.params, sb, cfg, mistake)
    assert max_diff(state.params["net"], wrong_net) > 100 * ATOL, mistake
  return metrics, ref


# ----------------------------------------------------------------------------- tests


def proximal_logp(setup) -> np.ndarray:
  sb = setup["batch"]
  return np.asarray(setup["policy"].evaluate(setup["state0"].params, {"state": sb.obs["state"][:T]}, sb.actions)[0])


@pytest.mark.parametrize("name", ["decoupled_ppo", "decoupled_ppo_raw_adv"])
def test_decoupled_ppo_matches_reference(setup, name):
  sb = setup["batch"]
  # The data is off-policy: behaviour weights fall on both sides of 1, and some hit the clip.
  weight = np.exp(proximal_logp(setup) - sb.logp)
  assert (weight < 0.7).any() and (weight > CONFIGS[name].ppo.behaviour_weight_clip).any()
  metrics, _ = check_against_reference(setup, name, ("swapped", "ratio_inverted", "no_weight"))
  # The ratio against the proximal policy starts at 1 (up to rounding): nothing is clipped.
  assert float(metrics["clip_fraction"]) == 0.0


def test_vtrace_matches_reference(setup):
  metrics, ref = check_against_reference(setup, "vtrace", ("log_rho_negated", "ratio_vs_proximal",
                                                           "ratio_inverted"))
  # Against the behaviour policy the PPO ratio is not 1: its clip acts.
  assert ref["clip_fraction"] > 0 and float(metrics["clip_fraction"]) > 0


def test_vtrace_reference_is_gae_on_policy():
  """The reference's V-trace reduces to GAE(lambda) returns when pi = mu (a check of the reference)."""
  rng = np.random.default_rng(3)
  rewards, values = rng.normal(size=(T, B)), rng.normal(size=(T + 1, B))
  terminated = rng.random((T, B)) < 0.2
  cut = terminated | (rng.random((T, B)) < 0.2)
  _, vs = np_vtrace(rewards, values, terminated, cut, np.zeros((T, B)), 0.9, 0.8, 1.0, 1.0)
  _, returns = np_gae(rewards, values, terminated, cut, 0.9, 0.8)
  np.testing.assert_allclose(vs, returns, rtol=1e-12)


def _too_old(sb: SegmentBatch) -> np.ndarray:
  """More than max_staleness versions behind the learner, valid or not."""
  return LEARNER_VERSION - sb.version > BASE.max_staleness


def test_stale_dropped_counts_only_valid_stale_samples(setup):
  sb = setup["batch"]
  _, metrics = run_update(setup, "decoupled_ppo", sb)
  # Invalid samples are not counted, however old (segment 2's first).
  assert int(metrics["stale_dropped"]) == int((sb.valid & _too_old(sb)).sum()) == 3
  assert (~sb.valid & _too_old(sb)).any()
  # Exactly max_staleness old is still fresh; one version more is dropped.
  one = lambda version: sb.replace(version=np.full((T, B), version, np.int32))
  assert int(run_update(setup, "decoupled_ppo", one(LEARNER_VERSION - BASE.max_staleness))[1]["stale_dropped"]) == 0
  assert int(run_update(setup, "decoupled_ppo", one(LEARNER_VERSION - BASE.max_staleness - 1))[1]["stale_dropped"]) \
      == int(sb.valid.sum())


@pytest.mark.parametrize("name", ["decoupled_ppo", "vtrace"])
def test_stale_samples_have_no_influence(setup, name):
  sb = setup["batch"]
  stale = _too_old(sb)
  # Each stale observation is either a segment's first or the bootstrap of another stale sample.
  rows = np.argwhere(stale)
  assert all(t == 0 or stale[t - 1, j] for t, j in rows)
  rng = np.random.default_rng(11)
  noisy = lambda x, scale: np.where(stale.reshape(stale.shape + (1,) * (x.ndim - 2)),
                                    rng.normal(0.0, scale, x.shape), x).astype(x.dtype)
  obs = sb.obs["state"].copy()
  obs[:T] = noisy(obs[:T], 30.0)
  altered = sb.replace(rewards=noisy(sb.rewards, 100.0), actions=noisy(sb.actions, 3.0), logp=noisy(sb.logp, 2.0),
                       obs={"state": obs})
  a, ma = run_update(setup, name, sb)
  b, mb = run_update(setup, name, altered)
  assert leaves_equal(a.params, b.params)
  assert leaves_equal(a.opt_state, b.opt_state)
  for k in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "stale_dropped"):
    assert ma[k] == mb[k], k
  # Dropping a stale sample is the same as marking it invalid.
  c, _ = run_update(setup, name, sb.replace(valid=sb.valid & ~stale, version=np.where(stale, LEARNER_VERSION,
                                                                                       sb.version)))
  assert leaves_equal(a.params, c.params)
  # The altered samples would have mattered, had they been fresh.
  d, _ = run_update(setup, name, altered.replace(version=np.full((T, B), LEARNER_VERSION, np.int32)))
  e, _ = run_update(setup, name, sb.replace(version=np.full((T, B), LEARNER_VERSION, np.int32)))
  assert max_diff(d.params["net"], e.params["net"]) > 1e-4


def test_stale_sample_with_overflowing_ratio_has_no_influence(setup):
  """V-trace takes the PPO ratio against the behaviour policy, so a stale sample the
  current policy finds far likelier than its behaviour policy did (log ratio 100, a
  finite log-prob but beyond float32's exp) reaches the surrogate as inf. Masked, it
  must still drop out rather than turn the loss into NaN and cost the whole update."""
  sb = setup["batch"]
  stale = _too_old(sb)
  a, _ = run_update(setup, "vtrace", sb)
  b, metrics = run_update(setup, "vtrace", sb.replace(logp=np.where(stale, proximal_logp(setup) - 100.0,
                                                                      sb.logp).astype(np.float32)))
  assert int(metrics["skipped_updates"]) == 0
  assert leaves_equal(a.params, b.params)

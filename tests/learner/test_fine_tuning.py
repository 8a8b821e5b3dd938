"""RL fine-tuning of a pre-trained policy: critic warm-up, the KL penalty toward the warm start, and the
start / final evaluation a fine-tuning run's summary.json reports.

The penalty is checked against an independent computation: the reference loss of
tests/learner/test_learner.py plus k3 = exp(d) - d - 1 (d = reference log-prob - log-prob)
written out here, differentiated by jax.grad and stepped by the NumPy Adam there; for
the vla, whose token distributions are exact, the KL summed over every token's bins.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl import warm_start
from ebrl.algorithms.ppo import token_kl_to_reference
from ebrl.learner import Learner, with_reference
from ebrl.types import SegmentBatch
from policies.base import critic_mask
from policies.cnn import CNNPolicy
from policies.flow import FlowPolicy
from policies.mlp import MLPPolicy
from policies.vla import VLAPolicy
from sim_adapters.base import EnvSpec, ObsSpec

from test_learner import CFG, N, OBS_DIM, ACTION_DIM, T, NumpyAdam, assert_tree_close, device, host, make_rollout, \
    ref_gae, ref_loss, tiny_spec  # pylint: disable=g-bad-import-order
from test_learner import _full_precision_matmuls  # pylint: disable=unused-import  # Autouse here too.

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def policy():
  return MLPPolicy(tiny_spec(), hidden=(16, 16))


def _leaves(tree, mask, want: bool) -> list[np.ndarray]:
  return [np.asarray(x) for x, m in zip(jax.tree.leaves(tree), jax.tree.leaves(mask)) if m == want]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(a, b))


# ----------------------------------------------------------------------------- which leaves are the critic


def test_critic_mask_names_each_policys_critic_and_nothing_else():
  """mlp, cnn and flow keep their value torso under "critic", vla its value head under "value_head";
  attention's own "value" projection (vla) and shared encoders act, so they are not the critic's."""
  state = EnvSpec(name="tiny", obs={"state": ObsSpec((6,), np.float32)}, action_dim=4,
                  action_low=-np.ones(4, np.float32), action_high=np.ones(4, np.float32), max_episode_steps=10,
                  has_success=False)
  pixels = dataclasses.replace(state, obs={**state.obs, "pixels": ObsSpec((16, 16, 3), np.uint8)})
  policies = {"mlp": MLPPolicy(state, hidden=(8,)), "cnn": CNNPolicy(pixels, channels=(4,), hidden=(8,)),
              "flow": FlowPolicy(state, hidden=(8,), critic_hidden=(8,)),
              "vla": VLAPolicy(state, chunk_size=1, bins=8, width=16, depth=1, heads=2)}
  for name, p in policies.items():
    net = jax.eval_shape(p.init, jax.random.key(0))["net"]
    paths = ["/".join(warm_start.key_name(k) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(net)[0]]
    mask = dict(zip(paths, jax.tree.leaves(critic_mask(net))))
    critic = {q for q, m in mask.items() if m}
    expected = {q for q in paths if q.split("/")[0] == ("value_head" if name == "vla" else "critic")}
    assert critic == expected and critic and len(critic) < len(paths), (name, critic)


# ----------------------------------------------------------------------------- critic warm-up


def test_critic_warmup_trains_only_the_critic_then_everything(policy):
  """For critic_warmup_updates updates every leaf but the critic's, and the observation statistics,
  are bit-identical (what acts is unchanged); the critic learns meanwhile; the next update moves the
  actor, and its Adam state started clean (zero gradients leave zero moments)."""
  cfg = dataclasses.replace(CFG, epochs=2, num_minibatches=2, critic_warmup_updates=2)
  learner = Learner(policy, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  mask = critic_mask(state0.params["net"])
  state, flags = state0, []
  for i in range(3):
    rollout = make_rollout(policy, state.params, seed=10 + i, p_end=0.2)
    new, metrics = learner.update(device(state), rollout)
    new = host(new)
    flags.append(float(metrics["critic_warmup"]))
    if i < 2:
      assert _same(_leaves(new.params["net"], mask, False), _leaves(state0.params["net"], mask, False))
      assert _same(jax.tree.leaves(new.params["obs_norm"]), jax.tree.leaves(state0.params["obs_norm"]))
      assert not _same(_leaves(new.params["net"], mask, True), _leaves(state.params["net"], mask, True))
      adam = new.opt_state[1].inner_state[0]
      assert all(not np.any(np.asarray(m)) for m in _leaves(adam.mu, mask, False))
    else:
      assert not any(np.array_equal(a, b) for a, b in zip(_leaves(new.params["net"], mask, False),
                                                          _leaves(state.params["net"], mask, False))
                     if a.size > 1)
      assert not _same(jax.tree.leaves(new.params["obs_norm"]), jax.tree.leaves(state.params["obs_norm"]))
    state = new
  assert flags == [1.0, 1.0, 0.0]


# ----------------------------------------------------------------------------- KL penalty toward the warm start


def _k3(logp, ref_logp, w):
  d = ref_logp - logp
  return jnp.sum(w * (jnp.exp(d) - d - 1.0))


def _perturbed(params, scale, seed):
  """Params whose actor differs from `params`: the reference a fine-tuning run started from."""
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params["net"]))))
  net = jax.tree.map(lambda x: np.asarray(x + scale * jax.random.normal(next(keys), x.shape), np.float32),
                     params["net"])
  return {**params, "net": net}


def test_kl_penalty_update_matches_reference(policy):
  """One full-batch step with ref_kl_coef: the reported ref_kl is k3 over the valid samples, and the
  net after the step is the hand-written loss (PPO + coef * k3) stepped by NumPy's Adam."""
  coef = 0.7
  cfg = dataclasses.replace(CFG, epochs=1, num_minibatches=1, ref_kl_coef=coef)
  learner = Learner(policy, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  reference = _perturbed(state0.params, 0.3, seed=1)
  state0 = state0.replace(reference=reference)
  ro = make_rollout(policy, state0.params, seed=3, p_end=0.2)
  new, metrics = learner.update(device(state0), ro)

  adv, ret = ref_gae(ro.rewards * cfg.reward_scale, ro.values, ro.terminated, ro.done, cfg.gamma, cfg.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  batch = dict(obs=ro.obs["state"][:T].reshape(T * N, OBS_DIM), actions=ro.actions[:T].reshape(T * N, ACTION_DIM),
               logp=ro.logp.reshape(-1), values=ro.values[:-1].reshape(-1), adv=f32(adv.reshape(-1)),
               returns=f32(ret.reshape(-1)), mask=f32(ro.valid.reshape(-1)))
  ref_logp, _, _ = policy.evaluate(reference, {"state": batch["obs"]}, batch["actions"])
  w = batch["mask"] / batch["mask"].sum()

  def loss(net, stats):
    base, _ = ref_loss(net, stats, batch, policy, cfg.ppo)
    logp, _, _ = policy.evaluate({"net": net, "obs_norm": stats}, {"state": batch["obs"]}, batch["actions"])
    kl = _k3(logp, ref_logp, w)
    return base + coef * kl, kl

  net, stats = state0.params["net"], state0.params["obs_norm"]
  (_, kl), grads = jax.value_and_grad(loss, has_aux=True)(net, stats)
  assert float(kl) > 1e-3
  assert float(metrics["ref_kl"]) == pytest.approx(float(kl), rel=1e-5)
  adam = NumpyAdam(jax.tree.leaves(net), cfg.learning_rate, cfg.max_grad_norm)
  leaves, _ = adam.step(jax.tree.leaves(net), jax.tree.leaves(grads))
  expected = jax.tree.unflatten(jax.tree.structure(net), [f32(x) for x in leaves])
  assert_tree_close(host(new).params["net"], expected, atol=1e-6)
  # The reference is carried along untouched.
  assert_tree_close(host(new).reference, reference, atol=0.0, rtol=0.0)


def test_kl_penalty_at_the_reference_changes_nothing_and_pulls_back_elsewhere(policy):
  """At its reference the penalty is 0 with a zero gradient, so the update is PPO's; away from it a
  large coefficient moves the policy toward the reference (its k3 falls)."""
  base_cfg = dataclasses.replace(CFG, epochs=1, num_minibatches=1)
  plain = Learner(policy, base_cfg)
  state0 = host(plain.init(jax.random.key(0)))
  ro = make_rollout(policy, state0.params, seed=4, p_end=0.2)
  penalised = Learner(policy, dataclasses.replace(base_cfg, ref_kl_coef=1.0))
  expected, _ = plain.update(device(state0), ro)
  got, metrics = penalised.update(device(state0.replace(reference=state0.params)), ro)
  assert float(metrics["ref_kl"]) == 0.0
  assert_tree_close(host(got).params["net"], host(expected).params["net"], atol=1e-7)

  reference = _perturbed(state0.params, 0.3, seed=2)
  strong = Learner(policy, dataclasses.replace(base_cfg, epochs=8, ref_kl_coef=50.0, learning_rate=1e-2))
  after, first = strong.update(device(state0.replace(reference=reference)), ro)
  again, second = strong.update(after, ro)
  assert float(second["ref_kl"]) < 0.5 * float(first["ref_kl"])


def test_warm_start_reference_is_a_copy_the_update_can_donate(policy, tmp_path):
  """A warm start sets params and reference to the loaded params, in buffers of their own: the
  update donates the state without XLA seeing one buffer twice, and the reference stays."""
  learner = Learner(policy, dataclasses.replace(CFG, ref_kl_coef=0.5))
  state = learner.init(jax.random.key(0))
  pre = _perturbed(host(state).params, 0.1, seed=5)
  warm_start.save_params(str(tmp_path / "sft"), pre)
  loaded = warm_start.load_params(str(tmp_path / "sft"), state.params)
  state = with_reference(state, loaded)
  assert all(a.unsafe_buffer_pointer() != b.unsafe_buffer_pointer()
             for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(state.reference)))
  ro = make_rollout(policy, pre, seed=6, p_end=0.2)
  new, _ = learner.update(state, ro)
  assert_tree_close(host(new).reference, pre, atol=0.0, rtol=0.0)
  # Without a penalty no reference is kept.
  assert with_reference(Learner(policy, CFG).init(jax.random.key(0)), loaded).reference is None


# ----------------------------------------------------------------------------- PPO ratios per action token


def _token_loss(policy, net, stats, batch, prox_tokens, ppo):
  """PPO with each action token's ratio clipped on its own and its decision's advantage, averaged over the
  decision's tokens, plus the value and entropy terms of ref_loss (no value clipping here)."""
  tok, entropy, value = policy.evaluate_tokens({"net": net, "obs_norm": stats}, {"state": batch["obs"]},
                                               batch["actions"])
  w = batch["mask"] / jnp.sum(batch["mask"])
  mu = jnp.sum(w * batch["adv"])
  adv = (batch["adv"] - mu) / (jnp.sqrt(jnp.sum(w * (batch["adv"] - mu) ** 2)) + 1e-8)
  ratio = jnp.exp(tok - prox_tokens)
  a = adv[:, None]
  surrogate = jnp.where(a >= 0, jnp.minimum(ratio, 1 + ppo.clip_eps), jnp.maximum(ratio, 1 - ppo.clip_eps)) * a
  policy_loss = -jnp.sum(w * surrogate.mean(-1))
  value_loss = 0.5 * jnp.sum(w * (value - batch["returns"]) ** 2)
  return policy_loss + ppo.vf_coef * value_loss - ppo.ent_coef * jnp.sum(w * entropy)


def _sampled_rollout(policy, params, seed: int):
  """make_rollout's episode structure with the policy's own sampled actions (a flow's raw action is its
  whole chain, which random actions are not) and their log-probs."""
  ro = make_rollout(MLPPolicy(tiny_spec(), hidden=(4,)), MLPPolicy(tiny_spec(), hidden=(4,)).init(jax.random.key(0)),
                    seed=seed, p_end=0.2)
  obs = np.concatenate([ro.obs["state"], ro.obs["state"][-1:]])  # [T + 1, N, OBS_DIM]: the last row bootstraps.
  flat_obs = {"state": jnp.asarray(obs.reshape((T + 1) * N, OBS_DIM))}
  actions, _, _, _ = policy.sample(params, flat_obs, jax.random.key(seed))
  actions = np.asarray(actions).reshape(T + 1, N, -1)
  logp, _, values = jax.jit(policy.evaluate)(params, {"state": obs}, actions)
  return dataclasses.replace(ro, actions=actions[:T], logp=np.asarray(logp)[:T], values=np.asarray(values))


@pytest.mark.parametrize("name", ["vla", "flow"])
def test_token_ratios_update_matches_reference(name):
  """algorithm.ratio_level="token": two full-batch steps (the second with ratios away from 1, some
  clipped) equal the hand-written per-token loss stepped by NumPy's Adam, the ratios taken against the
  params the update started from. The vla's tokens are its action tokens, the flow's its denoising
  steps (DPPO)."""
  spec = tiny_spec()
  if name == "vla":
    policy, tokens = VLAPolicy(spec, chunk_size=1, bins=16, width=16, depth=1, heads=2), ACTION_DIM
  else:
    policy, tokens = FlowPolicy(spec, chunk_size=1, steps=3, hidden=(16, 16), critic_hidden=(16, 16),
                                init_log_std=-1.0), 3
  ppo = dataclasses.replace(CFG.ppo, value_clip_eps=0.0)
  cfg = dataclasses.replace(CFG, epochs=2, num_minibatches=1, ratio_level="token", learning_rate=3e-2, ppo=ppo)
  learner = Learner(policy, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  ro = make_rollout(policy, state0.params, seed=7, p_end=0.2) if name == "vla" else \
      _sampled_rollout(policy, state0.params, seed=7)
  new, metrics = learner.update(device(state0), ro)

  adv, ret = ref_gae(ro.rewards * cfg.reward_scale, ro.values, ro.terminated, ro.done, cfg.gamma, cfg.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  batch = dict(obs=ro.obs["state"][:T].reshape(T * N, OBS_DIM), actions=ro.actions[:T].reshape(T * N, -1),
               adv=f32(adv.reshape(-1)), returns=f32(ret.reshape(-1)), mask=f32(ro.valid.reshape(-1)))
  net, stats = state0.params["net"], state0.params["obs_norm"]
  prox, _, _ = policy.evaluate_tokens(state0.params, {"state": batch["obs"]}, batch["actions"])
  assert prox.shape == (T * N, tokens)  # vla: one token per action dimension; flow: one per denoising step.
  grad = jax.grad(lambda n: _token_loss(policy, n, stats, batch, prox, ppo))
  adam = NumpyAdam(jax.tree.leaves(net), cfg.learning_rate, cfg.max_grad_norm)
  leaves = jax.tree.leaves(net)
  for _ in range(cfg.epochs):
    current = jax.tree.unflatten(jax.tree.structure(net), [f32(x) for x in leaves])
    leaves, _ = adam.step(leaves, jax.tree.leaves(grad(current)))
  expected = jax.tree.unflatten(jax.tree.structure(net), [f32(x) for x in leaves])
  assert float(metrics["clip_fraction"]) > 0  # The second step's ratios reach the clip.
  # float32 on another CPU: a leaf with a near-zero gradient takes an Adam step of up to lr (3e-2) whose size
  # rounding moves by a few 1e-6; a wrong loss moves leaves by a fraction of lr.
  assert_tree_close(host(new).params["net"], expected, atol=6e-6)


def _np_categorical_kl(logp_all: np.ndarray, ref_all: np.ndarray, mask: np.ndarray) -> float:
  """KL(p || r) summed over a decision's tokens, from probabilities, averaged over the valid samples."""
  p, r = np.exp(logp_all.astype(np.float64)), np.exp(ref_all.astype(np.float64))
  per_sample = np.sum(p * np.log(p / r), axis=(-2, -1))
  return float(np.sum(per_sample * mask) / mask.sum())


def test_exact_token_kl_is_the_categorical_kl_over_valid_samples():
  rng = np.random.default_rng(0)
  logits = rng.normal(0.0, 2.0, (2, 5, 3, 8))
  logp, ref = (np.asarray(jax.nn.log_softmax(x, axis=-1), np.float32) for x in logits)
  mask = np.array([1, 1, 0, 1, 0], np.float32)
  got = float(token_kl_to_reference(jnp.asarray(logp), jnp.asarray(ref), jnp.asarray(mask)))
  assert got == pytest.approx(_np_categorical_kl(logp, ref, mask), rel=1e-5)
  assert float(token_kl_to_reference(jnp.asarray(logp), jnp.asarray(logp), jnp.asarray(mask))) == 0.0


@pytest.mark.parametrize("ratio_level", [pytest.param("token", marks=pytest.mark.slow), "decision"])  # Token ratios: test_token_ratios_update_matches_reference.
def test_vla_segment_update_with_exact_kl_matches_reference(ratio_level):
  """update_segments on the vla with a KL penalty: one full-batch step on off-policy segments equals the
  hand-written loss stepped by NumPy's Adam: ratios (per token or per decision) against the params the
  update starts from, each decision weighed by min(exp(proximal - behaviour), clip), plus coef times the
  KL to the reference summed over every token's bins. The reported ref_kl is that KL computed in NumPy
  from probabilities, not the one-draw estimate."""
  spec, coef = tiny_spec(), 0.5
  vla = VLAPolicy(spec, chunk_size=1, bins=16, width=16, depth=1, heads=2)
  ppo = dataclasses.replace(CFG.ppo, value_clip_eps=0.0)
  cfg = dataclasses.replace(CFG, ratio_level=ratio_level, ref_kl_coef=coef, ppo=ppo)
  learner = Learner(vla, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  reference = _perturbed(state0.params, 0.3, seed=8)
  state0 = state0.replace(reference=reference)

  rng = np.random.default_rng(9)
  obs = rng.normal(1.0, 2.0, (T + 1, N, OBS_DIM)).astype(np.float32)
  actions = rng.uniform(-1.0, 1.0, (T, N, ACTION_DIM)).astype(np.float32)
  terminated, done, valid = np.zeros((T, N), bool), np.zeros((T, N), bool), np.ones((T, N), bool)
  terminated[2, 0] = done[2, 0] = True
  done[3, 1] = True
  valid[3, 0] = valid[4, 1] = False  # The automatic resets after them.
  rewards = np.where(valid, rng.normal(0.0, 1.0, (T, N)), 0.0).astype(np.float32)
  prox_tok, _, _ = vla.evaluate_tokens(state0.params, {"state": obs[:T]}, actions)
  prox_tok = np.asarray(prox_tok, np.float32)
  behaviour = (prox_tok.sum(-1) + rng.normal(0.0, 0.6, (T, N))).astype(np.float32)  # Off-policy both ways.
  sb = SegmentBatch(obs={"state": obs}, actions=actions, logp=behaviour, rewards=rewards, terminated=terminated,
                    done=done, valid=valid, version=np.zeros((T, N), np.int32))
  new, metrics = learner.update_segments(device(state0), sb)

  _, _, values = vla.evaluate(state0.params, {"state": obs}, np.concatenate([actions, actions[:1] * 0]))
  next_valid = np.concatenate([valid[1:], np.ones((1, N), bool)])
  adv, ret = ref_gae(rewards * cfg.reward_scale, np.asarray(values), terminated, done | ~next_valid, cfg.gamma,
                     cfg.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  mask = f32(valid.reshape(-1))
  batch = dict(obs=obs[:T].reshape(T * N, OBS_DIM), actions=actions.reshape(T * N, ACTION_DIM),
               adv=f32(adv.reshape(-1)), returns=f32(ret.reshape(-1)), mask=mask)
  prox = prox_tok.reshape(T * N, ACTION_DIM)
  weight = np.minimum(np.exp(prox.sum(-1) - behaviour.reshape(-1)), ppo.behaviour_weight_clip)
  assert (weight < 0.7).any() and (weight >= ppo.behaviour_weight_clip).any()
  tokens = vla.action_tokenizer.to_tokens(batch["actions"])
  ref_all, _ = vla.token_logits(reference, {"state": batch["obs"]}, tokens)
  stats = state0.params["obs_norm"]

  def loss(net):
    p = {"net": net, "obs_norm": stats}
    tok, entropy, value = vla.evaluate_tokens(p, {"state": batch["obs"]}, batch["actions"])
    w = batch["mask"] / jnp.sum(batch["mask"])
    mu = jnp.sum(w * batch["adv"])
    a = (batch["adv"] - mu) / (jnp.sqrt(jnp.sum(w * (batch["adv"] - mu) ** 2)) + 1e-8)
    if ratio_level == "token":
      ratio, a_ = jnp.exp(tok - prox), a[:, None]
    else:
      ratio, a_ = jnp.exp(tok.sum(-1) - prox.sum(-1)), a
    surrogate = jnp.where(a_ >= 0, jnp.minimum(ratio, 1 + ppo.clip_eps), jnp.maximum(ratio, 1 - ppo.clip_eps)) * a_
    surrogate = surrogate.mean(-1) if ratio_level == "token" else surrogate
    policy_loss = -jnp.sum(w * weight * surrogate)
    value_loss = 0.5 * jnp.sum(w * (value - batch["returns"]) ** 2)
    logp_all, _ = vla.token_logits(p, {"state": batch["obs"]}, tokens)
    kl = jnp.sum(jnp.exp(logp_all) * (logp_all - ref_all), axis=(-2, -1))
    return policy_loss + ppo.vf_coef * value_loss - ppo.ent_coef * jnp.sum(w * entropy) + coef * jnp.sum(w * kl)

  net = state0.params["net"]
  adam = NumpyAdam(jax.tree.leaves(net), cfg.learning_rate, cfg.max_grad_norm)
  leaves, _ = adam.step(jax.tree.leaves(net), jax.tree.leaves(jax.grad(loss)(net)))
  expected = jax.tree.unflatten(jax.tree.structure(net), [f32(x) for x in leaves])
  # float32 on another CPU: a leaf with a near-zero gradient takes an Adam step of up to lr (3e-2) whose size
  # rounding moves by a few 1e-6; a wrong loss moves leaves by a fraction of lr.
  assert_tree_close(host(new).params["net"], expected, atol=6e-6)
  start_all, _ = vla.token_logits(state0.params, {"state": batch["obs"]}, tokens)
  kl = _np_categorical_kl(np.asarray(start_all), np.asarray(ref_all), mask)
  assert kl > 1e-3
  assert float(metrics["ref_kl"]) == pytest.approx(kl, rel=1e-4)


# ----------------------------------------------------------------------------- a fine-tuning run, end to end


def test_fine_tuning_run_reports_start_and_final_success_per_task(tmp_path):
  """launch.train from a launch.sft-style directory with critic warm-up, a KL penalty and evaluation:
  summary.json has the starting and the final evaluation per task; the first update's metrics row
  reports the warm-up; the checkpoint keeps the reference, so a resumed run penalises toward it."""
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  name = "MetaWorld/MT:Reach-v3,Push-v3"
  sys.path.insert(0, ROOT)
  from ebrl import defaults  # pylint: disable=g-import-not-at-top
  from policies import make_policy  # pylint: disable=g-import-not-at-top
  from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top
  cfg = defaults.get_config()
  cfg.policy.hidden = (16, 16)
  adapter = make_adapter(name, 2, seed=0)
  spec = adapter.spec
  adapter.close()
  pre = make_policy("mlp", spec, cfg.policy).init(jax.random.key(7))
  warm_start.save_params(str(tmp_path / "sft"), pre)
  args = [f"--config.env.name={name}", "--config.num_envs=4", "--config.rollout_length=8",
          "--config.total_env_steps=96", "--config.env.max_episode_steps=12", "--config.policy.hidden=(16,16)",
          "--config.algorithm.num_minibatches=2", "--config.algorithm.epochs=1",
          "--config.algorithm.critic_warmup_updates=1", "--config.algorithm.ref_kl_coef=0.1",
          "--config.eval_episodes=2", f"--config.warm_start={tmp_path / 'sft'}", f"--workdir={tmp_path / 'run'}",
          "--progress=false"]
  proc = subprocess.run([sys.executable, "-m", "launch.train", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  for when in ("start_eval", "final_eval"):
    ev = summary[when]
    assert ev["episodes"] == 4 and set(ev["success_rate_by_task"]) == {"Reach-v3", "Push-v3"}, ev
    assert all(0.0 <= v <= 1.0 for v in ev["success_rate_by_task"].values())
  assert "start evaluation (4 episodes)" in proc.stdout + proc.stderr
  rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  trained = [r for r in rows if "critic_warmup" in r]
  assert trained and trained[-1]["critic_warmup"] == 0.0 and "ref_kl" in trained[-1]
  # The checkpoint holds the reference: the warm-start params, untouched by training.
  ckpt = tmp_path / "run" / "checkpoints"
  step = max(int(d) for d in os.listdir(ckpt) if d.isdigit())
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  tree = ocp.PyTreeCheckpointer().restore(str(ckpt / str(step) / "state"))
  saved = tree["reference"]["net"]["actor"]["Dense_0"]["kernel"]
  assert np.array_equal(np.asarray(saved), np.asarray(pre["net"]["actor"]["Dense_0"]["kernel"]))


# ----------------------------------------------------------------------------- the larger vla preset


def test_vla_large_preset_is_a_valid_run_of_the_documented_size():
  """launch/configs/vla_large.py validates as a run and builds a vla of width 256, depth 4 (several
  times the default's parameters), on MT10 with its instructions."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  from ebrl import defaults, validation  # pylint: disable=g-import-not-at-top
  from ebrl.validation import resolve  # pylint: disable=g-import-not-at-top
  from policies import make_policy  # pylint: disable=g-import-not-at-top
  from sim_adapters import make_adapter  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("vla_large", os.path.join(ROOT, "launch", "configs", "vla_large.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config()
  validation.check_devices(resolve(cfg), 1)
  assert (cfg.env.name, cfg.policy.name, cfg.policy.width, cfg.policy.depth) == ("MetaWorld/MT10", "vla", 256, 4)
  adapter = make_adapter(cfg.env.name, cfg.num_envs, seed=0, chunk_size=cfg.policy.chunk_size)
  env_spec = adapter.spec
  adapter.close()
  count = lambda c: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
      jax.eval_shape(make_policy("vla", env_spec, c.policy).init, jax.random.key(0))["net"]))
  small = defaults.get_config()
  small.policy.chunk_size = cfg.policy.chunk_size
  assert count(cfg) > 8 * count(small)


# ----------------------------------------------------------------------------- the fine-tuning recipe's update


def _batch(ro):
  """The rollout as the reference loss of test_learner reads it, with GAE from CFG."""
  adv, ret = ref_gae(ro.rewards * CFG.reward_scale, ro.values, ro.terminated, ro.done, CFG.gamma, CFG.gae_lambda)
  f32 = lambda x: np.asarray(x, np.float32)
  return dict(obs=ro.obs["state"][:T].reshape(T * N, OBS_DIM), actions=ro.actions[:T].reshape(T * N, ACTION_DIM),
              logp=ro.logp.reshape(-1), values=ro.values[:-1].reshape(-1), adv=f32(adv.reshape(-1)),
              returns=f32(ret.reshape(-1)), mask=f32(ro.valid.reshape(-1)))


def _demo_rows(n: int, seed: int) -> dict:
  rng = np.random.default_rng(seed)
  mask = np.ones((n, ACTION_DIM), np.float32)
  mask[-3:, 1:] = 0.0  # The tail of a chunk past an episode's end: not a target.
  return {"obs": {"state": rng.normal(size=(n, OBS_DIM)).astype(np.float32)},
          "actions": rng.uniform(-1, 1, size=(n, ACTION_DIM)).astype(np.float32), "mask": mask}


def test_frozen_observation_statistics_stay_bit_identical(policy):
  """obs_norm_update=frozen: the statistics a warm start brought never move, whatever the batches,
  while the net trains."""
  learner = Learner(policy, dataclasses.replace(CFG, epochs=2, num_minibatches=2, obs_norm_update="frozen"))
  state0 = host(learner.init(jax.random.key(0)))
  stats = jax.tree.map(np.asarray, state0.params["obs_norm"].replace(
      mean=np.linspace(-1, 1, OBS_DIM).astype(np.float32), var=np.full(OBS_DIM, 0.25, np.float32),
      count=np.float32(1234.0)))
  state = state0.replace(params={**state0.params, "obs_norm": stats})
  for i in range(3):
    new = host(learner.update(device(state), make_rollout(policy, state.params, seed=20 + i, p_end=0.2))[0])
    assert _same(jax.tree.leaves(new.params["obs_norm"]), jax.tree.leaves(stats))
    assert not _same(jax.tree.leaves(new.params["net"]), jax.tree.leaves(state.params["net"]))
    state = new


def test_demonstration_term_matches_an_independent_computation(policy):
  """bc_coef: one full-batch step whose demo draw is every row once (bc_batch_size = rows): the reported
  bc_loss is the masked Gaussian negative log-likelihood written out here with NumPy, and the step is
  the hand-written loss (PPO + weight * that NLL) stepped by the NumPy Adam; the weight decays as
  bc_coef * bc_decay**version."""
  demos = _demo_rows(24, seed=7)
  coef, decay = 0.8, 0.5
  cfg = dataclasses.replace(CFG, epochs=1, num_minibatches=1, bc_coef=coef, bc_decay=decay, bc_batch_size=24)
  learner = Learner(policy, cfg, demos=demos)
  state0 = host(learner.init(jax.random.key(0)))
  state0 = state0.replace(version=np.int32(2))
  ro = make_rollout(policy, state0.params, seed=8, p_end=0.2)
  new, metrics = learner.update(device(state0), ro)

  net, stats = state0.params["net"], state0.params["obs_norm"]
  weight = coef * decay ** 2
  assert float(metrics["bc_weight"]) == pytest.approx(weight)
  # The NLL by hand, in float64: (obs - mean) / sqrt(var + 1e-8) clipped to 10, the tanh torso, the sum
  # over valid action dims of 0.5 z^2 + log std + 0.5 log 2 pi, over the rows.
  mean, log_std, _ = policy._forward(state0.params, demos["obs"])  # pylint: disable=protected-access
  mean, log_std = np.asarray(mean, np.float64), np.asarray(log_std, np.float64)
  z = (demos["actions"] - mean) / np.exp(log_std)
  nll = np.sum((0.5 * z ** 2 + log_std + 0.5 * np.log(2 * np.pi)) * demos["mask"]) / len(z)
  assert float(metrics["bc_loss"]) == pytest.approx(nll, rel=1e-5)

  batch = _batch(ro)

  def loss(net):
    base, _ = ref_loss(net, stats, batch, policy, CFG.ppo)
    m, ls, _ = policy._forward({"net": net, "obs_norm": stats}, demos["obs"])  # pylint: disable=protected-access
    zz = (demos["actions"] - m) * jnp.exp(-ls)
    bc = jnp.sum((0.5 * zz ** 2 + ls + 0.5 * np.log(2 * np.pi)) * demos["mask"]) / zz.shape[0]
    return base + weight * bc

  grads = jax.grad(loss)(net)
  adam = NumpyAdam(jax.tree.leaves(net), cfg.learning_rate, cfg.max_grad_norm)
  leaves, _ = adam.step(jax.tree.leaves(net), jax.tree.leaves(grads))
  expected = jax.tree.unflatten(jax.tree.structure(net), [np.asarray(x, np.float32) for x in leaves])
  assert_tree_close(host(new).params["net"], expected, atol=1e-6)


def test_demo_draws_cover_every_row_before_repeating():
  from ebrl.learner import demo_draws  # pylint: disable=g-import-not-at-top
  idx = np.asarray(demo_draws(jax.random.key(3), 10, 3, 4))
  assert idx.shape == (3, 4)
  flat = idx.reshape(-1)
  assert sorted(flat[:10]) == list(range(10)) and set(flat[10:]) <= set(flat[:10])
  assert sorted(np.asarray(demo_draws(jax.random.key(4), 6, 1, 6))[0]) == list(range(6))


def test_actor_and_critic_have_their_own_optimiser_states_and_rates(policy):
  """actor_learning_rate / critic_learning_rate: two Adam states, each with its own gradient clip; one
  step equals two NumPy Adams, one over the actor's leaves at its rate and one over the critic's."""
  actor_lr, critic_lr = 1e-3, 2e-2
  cfg = dataclasses.replace(CFG, epochs=1, num_minibatches=1, actor_learning_rate=actor_lr,
                            critic_learning_rate=critic_lr)
  learner = Learner(policy, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  import optax  # pylint: disable=g-import-not-at-top
  assert isinstance(state0.opt_state, optax.MultiTransformState)
  assert set(state0.opt_state.inner_states) == {"actor", "critic"}
  ro = make_rollout(policy, state0.params, seed=9, p_end=0.2)
  new, metrics = learner.update(device(state0), ro)
  assert float(metrics["learning_rate"]) == pytest.approx(actor_lr)
  assert float(metrics["critic_learning_rate"]) == pytest.approx(critic_lr)

  net, stats = state0.params["net"], state0.params["obs_norm"]
  batch = _batch(ro)
  grads = jax.grad(lambda n: ref_loss(n, stats, batch, policy, CFG.ppo)[0])(net)
  mask = critic_mask(net)
  expected = {}
  for want, lr in ((False, actor_lr), (True, critic_lr)):
    adam = NumpyAdam(_leaves(net, mask, want), lr, cfg.max_grad_norm)
    expected[want] = adam.step(_leaves(net, mask, want), _leaves(grads, mask, want))[0]
  got = host(new).params["net"]
  for want in (False, True):
    for a, b in zip(_leaves(got, mask, want), expected[want]):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def test_critic_warmup_ends_when_the_critic_explains_the_returns(policy):
  """critic_warmup_ev: the warm-up lasts while the critic explains less than that fraction of the
  targets' variance, at most critic_warmup_updates updates, and never comes back once over."""
  cfg = dataclasses.replace(CFG, epochs=2, num_minibatches=2, critic_warmup_updates=2, critic_warmup_ev=0.9)
  learner = Learner(policy, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  mask = critic_mask(state0.params["net"])
  # A random critic on random returns: below the threshold, so the cap ends the warm-up.
  state, flags = state0, []
  for i in range(3):
    new, metrics = learner.update(device(state), make_rollout(policy, state.params, seed=30 + i, p_end=0.2))
    assert float(metrics["explained_variance"]) < 0.9
    flags.append(float(metrics["critic_warmup"]))
    new = host(new)
    if i < 2:
      assert _same(_leaves(new.params["net"], mask, False), _leaves(state0.params["net"], mask, False))
    state = new
  assert flags == [1.0, 1.0, 0.0] and bool(state.critic_ready)
  # Returns the critic predicts exactly (no reward, every value 0): explained at once, no warm-up.
  ro = make_rollout(policy, state0.params, seed=33, p_end=0.2)
  ro = ro.replace(rewards=np.zeros_like(ro.rewards), values=np.zeros_like(ro.values))
  new, metrics = learner.update(device(state0), ro)
  assert float(metrics["explained_variance"]) >= 0.9 and float(metrics["critic_warmup"]) == 0.0
  assert bool(host(new).critic_ready)
  # Once ended it stays ended, whatever the next batch explains.
  _, metrics = learner.update(new, make_rollout(policy, state0.params, seed=34, p_end=0.2))
  assert float(metrics["critic_warmup"]) == 0.0


def test_kl_on_the_mean_only_matches_its_formula_and_ignores_the_std(policy):
  """ref_kl_mode=mean: 0.5 sum((mu - mu_ref) / std_ref)^2 over the batch's valid samples, by hand; a
  policy that differs from its reference only in its std pays nothing."""
  cfg = dataclasses.replace(CFG, epochs=1, num_minibatches=1, ref_kl_coef=0.5, ref_kl_mode="mean")
  learner = Learner(policy, cfg)
  state0 = host(learner.init(jax.random.key(0)))
  reference = _perturbed(state0.params, 0.2, seed=11)
  ro = make_rollout(policy, state0.params, seed=12, p_end=0.2)
  _, metrics = learner.update(device(state0.replace(reference=reference)), ro)
  batch = _batch(ro)
  mu, _, _ = policy._forward(state0.params, {"state": batch["obs"]})  # pylint: disable=protected-access
  mu_ref, ls_ref, _ = policy._forward(reference, {"state": batch["obs"]})  # pylint: disable=protected-access
  per = 0.5 * np.sum(((np.asarray(mu, np.float64) - np.asarray(mu_ref)) / np.exp(np.asarray(ls_ref))) ** 2, -1)
  want = np.sum(per * batch["mask"]) / np.sum(batch["mask"])
  assert want > 1e-3 and float(metrics["ref_kl"]) == pytest.approx(want, rel=1e-5)
  # Only the std differs: no penalty.
  net = dict(state0.params["net"])
  net["log_std"] = np.asarray(net["log_std"]) - 1.0
  _, metrics = learner.update(device(state0.replace(params={**state0.params, "net": net},
                                                    reference=state0.params)), ro)
  assert float(metrics["ref_kl"]) == 0.0

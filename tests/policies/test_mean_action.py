"""The deterministic action evaluation acts with (`mean_action`), the std bounds of the Gaussian
policies, and the vla's detached critic: tiny shapes, a few jitted calls each."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ebrl import normalizer
from ebrl.param_store import ParamStore
from ebrl.sampler import Sampler
from launch.configs.default import get_config
from policies import make_policy
from policies.base import MeanActing
from policies.mlp import MLPPolicy, gaussian_logp
from sim_adapters.base import EnvSpec, ObsSpec
from test_vla import make_obs, make_spec, tiny

S, A, B = 5, 3, 6


def _state_spec() -> EnvSpec:
  return EnvSpec(name="toy", obs={"state": ObsSpec((S,), np.dtype(np.float32))}, action_dim=A,
                 action_low=-np.ones(A, np.float32), action_high=np.ones(A, np.float32), max_episode_steps=10,
                 has_success=True)


def _obs(b: int = B, seed: int = 0) -> dict:
  return {"state": jnp.asarray(np.random.default_rng(seed).normal(size=(b, S)).astype(np.float32))}


def test_mlp_mean_action_is_the_gaussian_mean_and_deterministic():
  policy = MLPPolicy(_state_spec(), hidden=(8,), init_log_std=-0.5)
  params = policy.init(jax.random.PRNGKey(0))
  params["net"]["actor"]["Dense_1"]["bias"] = jnp.arange(A, dtype=jnp.float32) * 0.3  # A mean away from 0.
  obs = _obs()
  mean = jax.jit(policy.mean_action)(params, obs)
  assert mean.shape == (B, A)
  forward = jax.jit(lambda p, o: policy._forward(p, o)[0])  # pylint: disable=protected-access
  np.testing.assert_array_equal(mean, forward(params, obs))
  np.testing.assert_array_equal(mean, jax.jit(policy.mean_action)(params, obs))
  # It is where the sampled actions centre, and the most likely action.
  draws = jax.vmap(lambda k: policy.sample(params, obs, k)[0])(jax.random.split(jax.random.PRNGKey(1), 4000))
  np.testing.assert_allclose(draws.mean(0), mean, atol=0.05)
  logp_mean = policy.evaluate(params, obs, mean)[0]
  assert bool(jnp.all(logp_mean >= policy.evaluate(params, obs, draws[0])[0]))


def test_mean_acting_and_the_sampler_in_mean_mode():
  """MeanActing's sample is the mean action (zero logp and value, any key); the Sampler's mean
  mode acts with it, while its default mode still samples."""
  spec = _state_spec()
  policy = MLPPolicy(spec, hidden=(8,), init_log_std=0.0)
  params = policy.init(jax.random.PRNGKey(0))
  obs = _obs()
  action, logp, value, extras = MeanActing(policy).sample(params, obs, jax.random.PRNGKey(5))
  np.testing.assert_array_equal(action, policy.mean_action(params, obs))
  assert not np.any(logp) and not np.any(value) and extras == {}
  assert MeanActing(policy).input_dim == policy.input_dim  # Every other attribute is the policy's.
  store = ParamStore()
  store.publish_params(params, 0)
  host_obs = {k: np.asarray(v) for k, v in obs.items()}
  mean = Sampler(policy, spec, store, seed=3, actions="mean")
  first, second = mean.act(host_obs)[0], mean.act(host_obs)[0]
  np.testing.assert_array_equal(first.action, second.action)
  np.testing.assert_allclose(first.action, policy.mean_action(params, obs), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(first.env_action, np.clip(first.action, -1, 1))
  sampled = Sampler(policy, spec, store, seed=3).act(host_obs)[0]
  assert not np.allclose(sampled.action, first.action)
  with pytest.raises(ValueError, match="actions='greedy' must be one of: sample, mean"):
    Sampler(policy, spec, store, actions="greedy")


def test_std_bounds_clip_log_std_in_the_forward_pass():
  cfg = get_config().policy
  cfg.hidden = (8,)
  spec = _state_spec()
  free = make_policy("mlp", spec, cfg)
  params = free.init(jax.random.PRNGKey(0))
  params["net"]["log_std"] = jnp.array([-5.0, 0.0, 2.0])
  obs = _obs()
  cfg.min_std, cfg.max_std = 0.1, 1.5
  bounded = make_policy("mlp", spec, cfg)
  assert (bounded.min_std, bounded.max_std) == (0.1, 1.5)
  _, log_std, _ = bounded._forward(params, obs)  # pylint: disable=protected-access
  np.testing.assert_allclose(log_std, [np.log(0.1), 0.0, np.log(1.5)], rtol=1e-6)
  np.testing.assert_array_equal(free._forward(params, obs)[1], params["net"]["log_std"])  # pylint: disable=protected-access
  # Only the side that is set is bounded, and log-probs and entropy use the bounded std.
  cfg.min_std, cfg.max_std = 0.0, 1.5
  upper = make_policy("mlp", spec, cfg)
  np.testing.assert_allclose(upper._forward(params, obs)[1], [-5.0, 0.0, np.log(1.5)], rtol=1e-6)  # pylint: disable=protected-access
  action = jnp.ones((B, A))
  mean = bounded.mean_action(params, obs)
  np.testing.assert_allclose(bounded.evaluate(params, obs, action)[0],
                             gaussian_logp(action, mean, jnp.log(jnp.array([0.1, 1.0, 1.5]))), rtol=1e-5)


def test_std_bounds_reach_the_cnn():
  cfg = get_config().policy
  cfg.min_std, cfg.max_std = 0.2, 0.9
  spec = EnvSpec(name="toy", obs={"pixels": ObsSpec((3, 8, 8), np.dtype(np.uint8))}, action_dim=A,
                 action_low=-np.ones(A, np.float32), action_high=np.ones(A, np.float32), max_episode_steps=10, has_success=False)
  cfg.channels, cfg.hidden = (4,), (8,)
  policy = make_policy("cnn", spec, cfg)
  params = policy.init(jax.random.PRNGKey(0))
  params["net"]["log_std"] = jnp.array([-3.0, 0.5, -0.5])
  obs = {"pixels": jnp.zeros((2, 3, 8, 8), jnp.uint8)}
  mean, log_std, _ = policy._forward(params, obs)  # pylint: disable=protected-access
  np.testing.assert_allclose(log_std, [np.log(0.2), np.log(0.9), -0.5], rtol=1e-6)
  np.testing.assert_array_equal(policy.mean_action(params, obs), mean)


@pytest.mark.parametrize("decode", ["parallel", "autoregressive"])
def test_vla_mean_action_decodes_greedily(decode):
  """Each greedy token is the argmax of its distribution given the greedy tokens before it (the
  teacher-forced logits), and the action is those tokens' bin centres."""
  spec = make_spec()
  policy = tiny(spec, decode)
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  obs = make_obs(spec, 4)
  tokens = jax.jit(policy.greedy_tokens)(params, obs)
  logp_all, _ = jax.jit(policy.token_logits)(params, obs, tokens)
  np.testing.assert_array_equal(tokens, jnp.argmax(logp_all, axis=-1))
  action = jax.jit(policy.mean_action)(params, obs)
  np.testing.assert_array_equal(action, policy.action_tokenizer.to_values(tokens))
  np.testing.assert_array_equal(policy.action_tokenizer.to_tokens(action), tokens)
  if decode == "parallel":  # Independent tokens: greedy is the most likely chunk, beyond any sample.
    logp = jax.jit(policy.evaluate)(params, obs, action)[0]
    sampled_logp = jax.jit(policy.sample)(params, obs, jax.random.PRNGKey(3))[1]
    assert bool(jnp.all(logp >= sampled_logp - 1e-5))


def test_vla_detached_critic_keeps_the_value_loss_off_the_trunk():
  spec = make_spec()
  policy = tiny(spec, "parallel", detach_critic=True)
  attached = tiny(spec, "parallel")
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  obs = make_obs(spec, 4)
  action = jnp.zeros((4, spec.action_dim))

  def value_grads(p):
    return jax.jit(jax.grad(lambda net: jnp.sum(jnp.square(p.evaluate({**params, "net": net}, obs, action)[2]))))(
        params["net"])

  detached, shared = value_grads(policy), value_grads(attached)
  for name, grad in detached.items():
    moved = any(bool(jnp.any(g != 0)) for g in jax.tree.leaves(grad))
    assert moved == (name == "value_head"), name
  assert any(bool(jnp.any(g != 0)) for g in jax.tree.leaves(shared["block0"]))  # Without it the trunk moves.
  # The actor is untouched: same logits, same value (stop_gradient changes gradients only).
  for a, b in zip(jax.jit(policy.evaluate)(params, obs, action), jax.jit(attached.evaluate)(params, obs, action)):
    np.testing.assert_array_equal(a, b)
  cfg = get_config().policy
  cfg.bins, cfg.width, cfg.depth, cfg.heads, cfg.chunk_size, cfg.detach_critic = 16, 16, 1, 2, 3, True
  assert make_policy("vla", spec, cfg).detach_critic


def test_vla_critic_mlp_reads_state_and_task_and_only_it_learns_from_the_value():
  """critic_hidden: the value is an MLP of its own (module "critic") over [CLS], the normalised state and the
  task one-hot; the value loss moves only its leaves (detach_critic), and the actor is the linear head's."""
  from policies.base import critic_mask  # pylint: disable=g-import-not-at-top
  spec = make_spec(num_tasks=3)
  policy = tiny(spec, "parallel", detach_critic=True, critic_hidden=(8, 8))
  head = tiny(spec, "parallel", detach_critic=True)
  params = jax.jit(policy.init)(jax.random.PRNGKey(0))
  assert "value_head" not in params["net"]
  assert [x.shape for x in jax.tree.leaves(params["net"]["critic"])] == [
      (8,), (16 + spec.obs["state"].shape[0] + 3, 8), (8,), (8, 8), (1,), (8, 1)]
  mask = critic_mask(params["net"])
  assert all(jax.tree.leaves(mask["critic"])) and not any(
      jax.tree.leaves({k: v for k, v in mask.items() if k != "critic"}))
  obs = make_obs(spec, 6)
  action = jnp.zeros((6, spec.action_dim))
  evaluate = jax.jit(policy.evaluate)
  value = evaluate(params, obs, action)[2]
  # Against the MLP computed here in NumPy from its weights and its inputs: the trunk's [CLS] feature
  # (final_norm's output at position 0), the state as the policy normalises it, and the task one-hot.
  flat = policy._flatten(obs)[1]  # pylint: disable=protected-access
  inputs = policy._net_inputs(params, flat)  # pylint: disable=protected-access
  _, inter = policy._net.apply({"params": params["net"]}, *inputs, jnp.zeros((6, spec.action_dim), jnp.int32),
                               policy._critic_inputs(params, flat),  # pylint: disable=protected-access
                               capture_intermediates=lambda m, _: m.name == "final_norm")
  cls = np.asarray(inter["intermediates"]["final_norm"]["__call__"][0][:, 0])
  state = normalizer.normalize(params["obs_norm"], obs["state"])
  x = np.concatenate([cls, np.asarray(state), np.asarray(obs["task"])], axis=-1)
  c = jax.tree.map(np.asarray, params["net"]["critic"])
  x = np.tanh(x @ c["Dense_0"]["kernel"] + c["Dense_0"]["bias"])
  x = np.tanh(x @ c["Dense_1"]["kernel"] + c["Dense_1"]["bias"])
  np.testing.assert_allclose(value, (x @ c["Dense_2"]["kernel"] + c["Dense_2"]["bias"])[:, 0], rtol=1e-5, atol=1e-5)
  grads = jax.jit(jax.grad(lambda net: jnp.sum(evaluate({**params, "net": net}, obs, action)[2])))(params["net"])
  assert {k for k, g in grads.items() if any(bool(jnp.any(x != 0)) for x in jax.tree.leaves(g))} == {"critic"}
  # The value changes with the task one-hot alone (same state, another task).
  other = {**obs, "task": jnp.roll(obs["task"], 1, axis=-1)}
  assert not np.allclose(value, evaluate(params, other, action)[2])
  # The actor's logits are those of the linear-head vla with the same trunk.
  head_params = {**params, "net": {**{k: v for k, v in params["net"].items() if k != "critic"},
                                   "value_head": jax.jit(head.init)(jax.random.PRNGKey(0))["net"]["value_head"]}}
  np.testing.assert_array_equal(jax.jit(policy.token_logits)(params, obs, action.astype(jnp.int32))[0],
                                jax.jit(head.token_logits)(head_params, obs, action.astype(jnp.int32))[0])
  with pytest.raises(ValueError, match="critic_hidden must be positive layer sizes"):
    tiny(spec, "parallel", critic_hidden=(8, 0))
  cfg = get_config().policy
  cfg.bins, cfg.width, cfg.depth, cfg.heads, cfg.chunk_size, cfg.vla_critic_hidden = 16, 16, 1, 2, 3, (8, 8)
  assert make_policy("vla", spec, cfg).critic_hidden == (8, 8)

"""The pixel actor-critic (policies/cnn.py) against the Policy contract."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from policies.base import IncompatibleObservationError
from policies.cnn import CNNPolicy, conv_layout
from sim_adapters.base import EnvSpec, ObsSpec

A = 4
U8, F32 = np.dtype(np.uint8), np.dtype(np.float32)


def make_spec(pixels=(3, 64, 64), state=None, tasks=0) -> EnvSpec:
  obs = {}
  if pixels is not None:
    obs["pixels"] = ObsSpec(pixels, U8)
  if state is not None:
    obs["state"] = ObsSpec((state,), F32)
  if tasks:
    obs["task"] = ObsSpec((tasks,), F32)
  return EnvSpec("test", obs, A, -np.ones(A, np.float32), np.ones(A, np.float32), 100, True, max(tasks, 1))


def make_obs(spec: EnvSpec, lead=(5,), seed=0) -> dict:
  rng = np.random.default_rng(seed)
  obs = {}
  for k, v in spec.obs.items():
    if v.dtype == U8:
      obs[k] = jnp.asarray(rng.integers(0, 256, lead + v.shape).astype(np.uint8))
    elif k == "task":
      obs[k] = jnp.asarray(np.eye(v.shape[0], dtype=np.float32)[rng.integers(0, v.shape[0], lead)])
    else:
      obs[k] = jnp.asarray(rng.normal(3.0, 2.0, lead + v.shape).astype(np.float32))
  return obs


# Frames smaller than the 64x64 default keep eager CPU tests fast; 64x64 is covered below.
SPECS = {
    "pixels": make_spec(pixels=(3, 36, 36)),
    "pixels+state+task": make_spec(pixels=(6, 36, 36), state=7, tasks=3),
    "small_frame": make_spec(pixels=(1, 16, 12)),
}


@pytest.fixture(scope="module", params=list(SPECS))
def setup(request):
  spec = SPECS[request.param]
  policy = CNNPolicy(spec)
  return spec, policy, jax.jit(policy.init)(jax.random.PRNGKey(0))


def test_contract_fields():
  policy = CNNPolicy(SPECS["pixels+state+task"])
  assert policy.name == "cnn" and policy.action_size == A
  assert policy.channels == (16, 32, 32) and policy.hidden == (64,) and policy.init_log_std == -0.5
  with pytest.raises(dataclasses.FrozenInstanceError):
    policy.hidden = (8,)  # type: ignore[misc]


def test_conv_layout_for_64x64():
  # NatureCNN's kernels: 64 -> 15 -> 6 -> 4.
  assert conv_layout(64, 64, 3) == ((8, 8, 4), (4, 4, 2), (3, 3, 1))
  params = jax.eval_shape(CNNPolicy(make_spec()).init, jax.random.PRNGKey(0))
  assert params["net"]["feature"]["kernel"].shape == (4 * 4 * 32, 50)  # The conv map, projected.
  assert params["net"]["actor"]["Dense_0"]["kernel"].shape == (50, 64)


def test_shapes(setup):
  spec, policy, params = setup
  obs = make_obs(spec)
  action, logp, value, extras = policy.sample(params, obs, jax.random.PRNGKey(1))
  assert action.shape == (5, A) and logp.shape == (5,) and value.shape == (5,) and extras == {}
  # The learner evaluates [T, N] batches.
  obs2 = make_obs(spec, lead=(3, 2))
  logp2, ent2, value2 = policy.evaluate(params, obs2, jnp.zeros((3, 2, A)))
  assert logp2.shape == ent2.shape == value2.shape == (3, 2)


def test_leading_axes_do_not_mix_rows(setup):
  spec, policy, params = setup
  obs = make_obs(spec, lead=(6,))
  actions = jax.random.normal(jax.random.PRNGKey(2), (6, A))
  flat = policy.evaluate(params, obs, actions)
  folded = policy.evaluate(params, jax.tree.map(lambda x: x.reshape((2, 3) + x.shape[1:]), obs),
                           actions.reshape(2, 3, A))
  for f, g in zip(flat, folded):
    np.testing.assert_allclose(np.asarray(g).reshape(-1), np.asarray(f), rtol=1e-5, atol=1e-5)


def test_sample_then_evaluate_logp(setup):
  spec, policy, params = setup
  obs = make_obs(spec)
  action, logp, value, _ = policy.sample(params, obs, jax.random.PRNGKey(3))
  logp2, _, value2 = policy.evaluate(params, obs, action)
  np.testing.assert_allclose(logp2, logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(value2, value, rtol=1e-5, atol=1e-5)


def test_logp_and_entropy_match_numpy_gaussian(setup):
  spec, policy, params = setup
  obs = make_obs(spec)
  mean, log_std, _ = policy._forward(params, obs)  # pylint: disable=protected-access
  mean, std = np.asarray(mean, np.float64), np.exp(np.asarray(log_std, np.float64))
  action = np.random.default_rng(4).normal(size=(5, A))
  want = np.sum(-0.5 * ((action - mean) / std) ** 2 - np.log(std * np.sqrt(2 * np.pi)), axis=-1)
  logp, entropy, _ = policy.evaluate(params, obs, jnp.asarray(action, jnp.float32))
  np.testing.assert_allclose(logp, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(entropy, np.full(5, np.sum(0.5 + 0.5 * np.log(2 * np.pi) + np.log(std))), rtol=1e-5)
  np.testing.assert_allclose(log_std, np.full(A, -0.5))


def test_jit_matches_eager(setup):
  spec, policy, params = setup
  obs = make_obs(spec)
  key = jax.random.PRNGKey(5)
  eager = policy.sample(params, obs, key)
  jitted = jax.jit(policy.sample)(params, obs, key)
  for e, j in zip(eager[:3], jitted[:3]):
    np.testing.assert_allclose(j, e, rtol=1e-5, atol=1e-5)
  ev = jax.jit(policy.evaluate)(params, obs, eager[0])
  np.testing.assert_allclose(ev[0], eager[1], rtol=1e-5, atol=1e-5)


def test_gradients_finite(setup):
  spec, policy, params = setup
  obs = make_obs(spec)
  actions = jax.random.normal(jax.random.PRNGKey(6), (5, A))

  def loss(net):
    logp, entropy, value = policy.evaluate({**params, "net": net}, obs, actions)
    return -logp.mean() - 0.01 * entropy.mean() + jnp.square(value - 1.0).mean()

  grads = jax.jit(jax.grad(loss))(params["net"])
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert float(jnp.abs(grads["encoder"]["Conv_0"]["kernel"]).sum()) > 0, "no gradient reaches the encoder"


def test_pixels_bypass_the_normaliser():
  spec = SPECS["pixels+state+task"]
  policy = CNNPolicy(spec)
  params = policy.init(jax.random.PRNGKey(0))
  assert params["obs_norm"].mean.shape == (7 + 3,)
  obs = make_obs(spec, lead=(4, 3))
  updated = policy.update_normalizer(params, obs, jnp.ones((4, 3)))
  assert updated["obs_norm"].mean.shape == (10,) and float(updated["obs_norm"].count) == 12
  np.testing.assert_allclose(updated["obs_norm"].mean[:7], np.asarray(obs["state"]).reshape(12, 7).mean(0),
                             rtol=1e-5)
  # The normalised state changes the outputs; the pixels go in raw (scaled in the net).
  a = policy.evaluate(params, obs, jnp.zeros((4, 3, A)))[2]
  b = policy.evaluate(updated, obs, jnp.zeros((4, 3, A)))[2]
  assert not np.allclose(a, b)


def test_pixels_only_normaliser_is_a_no_op():
  spec = SPECS["pixels"]
  policy = CNNPolicy(spec)
  params = policy.init(jax.random.PRNGKey(0))
  assert params["obs_norm"].mean.shape == (1,)
  updated = policy.update_normalizer(params, make_obs(spec), jnp.ones(5))
  assert jax.tree.map(jnp.shape, updated) == jax.tree.map(jnp.shape, params)
  for x, y in zip(jax.tree.leaves(updated), jax.tree.leaves(params)):
    np.testing.assert_array_equal(x, y)
  # Works inside jit (the learner jits update_normalizer with the update).
  jax.jit(policy.update_normalizer)(params, make_obs(spec), jnp.ones(5))


def test_no_pixels_is_incompatible():
  with pytest.raises(IncompatibleObservationError, match=r"policy 'cnn' needs observation key\(s\) \['pixels'\]"):
    CNNPolicy(make_spec(pixels=None, state=7))


def test_flat_pixels_are_rejected():
  with pytest.raises(ValueError, match=r"\[C, H, W\]"):
    CNNPolicy(make_spec(pixels=(64 * 64 * 3,)))


@pytest.mark.egl
def test_reads_envpool_pixels(make, tmp_path, monkeypatch):
  monkeypatch.setenv("EBRL_CACHE_DIR", str(tmp_path))
  adapter = make("MetaWorld/Reach-v3", 2, from_pixels=True, render_size=64)
  policy = CNNPolicy(adapter.spec)
  params = policy.init(jax.random.PRNGKey(0))
  adapter.reset()
  from sim_adapters.base import gather_all
  obs = {k: jnp.asarray(v) for k, v in gather_all(adapter, 2).obs.items()}
  action, logp, value, _ = jax.jit(policy.sample)(params, obs, jax.random.PRNGKey(1))
  assert action.shape == (2, 4) and np.isfinite(np.asarray(logp)).all() and np.isfinite(np.asarray(value)).all()
  adapter.step(np.clip(np.asarray(action), -1, 1))

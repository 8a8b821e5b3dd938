"""The DeviceSim contract (docs/ARCHITECTURE.md) for every named MJX / Brax env.

Each env is stepped with tiny batches; episodes are made to end at chosen
steps (by setting the per-env step counter or feeding a non-finite action) so
the tests can check that exactly the finished envs were reset, each from its
own reset key, while the others carried on. Envs whose first compile takes
longer than ~20 s on 2 CPU cores are marked slow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sim_adapters import UnknownEnvError, check_env_name
from sim_adapters.mjx import device_env_names, make_device_sim
from sim_adapters.mjx.names import BRAX_ENVS

FAST = ["mjx:CartpoleBalance"]
SLOW = ["mjx:PandaPickCube", "mjx:PandaOpenCabinet", "mjx:LeapCubeReorient", "mjx:Go1JoystickFlatTerrain",
        "brax:ant", "brax:humanoid", "brax:halfcheetah"]
ALL = [pytest.param(n) for n in FAST] + [pytest.param(n, marks=pytest.mark.slow) for n in SLOW]
N = 3
LIMIT = 6


def test_unknown_names_suggest_valid_ones():
  with pytest.raises(UnknownEnvError, match=r"'mjx:CartpoleBalanse'.*mjx:CartpoleBalance"):
    check_env_name("mjx:CartpoleBalanse")
  with pytest.raises(UnknownEnvError, match=r"'brax:antt'.*brax:ant"):
    check_env_name("brax:antt")
  with pytest.raises(UnknownEnvError, match=r"'mjx:G1JoystickFlatTerrain'"):
    check_env_name("mjx:G1JoystickFlatTerrain")  # Its Menagerie models are not packaged.
  check_env_name("mjx:PandaPickCube")
  check_env_name("brax:ant")


def test_names_exist_in_installed_libraries():
  from brax import envs
  from mujoco_playground import dm_control_suite, registry

  mjx_names = {n.split(":", 1)[1] for n in device_env_names() if n.startswith("mjx:")}
  assert mjx_names <= set(registry.ALL_ENVS)
  assert set(dm_control_suite.ALL_ENVS) <= mjx_names
  assert set(BRAX_ENVS) <= set(envs._envs)  # pylint: disable=protected-access


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _rows(tree, i):
  return jax.tree.map(lambda x: x[i], tree)


@pytest.mark.parametrize("name", ALL)
def test_contract(name):
  sim = make_device_sim(name, N, max_episode_steps=LIMIT)
  spec = sim.spec
  assert "state" in spec.obs and all(o.dtype == np.float32 for o in spec.obs.values())
  assert spec.max_episode_steps == LIMIT
  np.testing.assert_array_equal(spec.action_low, -1.0)
  np.testing.assert_array_equal(spec.action_high, 1.0)

  state = sim.reset(jax.random.PRNGKey(0))
  for k, o in spec.obs.items():
    assert state.obs[k].shape == (N,) + o.shape and state.obs[k].dtype == jnp.float32
  assert not np.asarray(state.done).any()
  first = _host(state.obs["state"])
  assert np.isfinite(first).all()

  # Env 1 is one step from its limit, env 2 gets a non-finite action, env 0 runs on.
  state = state.replace(steps=jnp.array([0, LIMIT - 1, 0], jnp.int32))
  keys_before = _host(state.key)
  action = np.zeros((N, spec.action_dim), np.float32)
  action[2] = np.nan
  reference = jax.jit(jax.vmap(sim.core.step))(state.env, jnp.asarray(np.nan_to_num(action)))
  ref_obs = _host(jax.vmap(sim.core.obs)(reference))
  state = sim.step(state, jnp.asarray(action))
  s = _host(state)

  assert s.reward.dtype == np.float32 and s.reward.shape == (N,)
  assert s.terminated.dtype == bool and s.truncated.dtype == bool
  assert s.success.shape == (N,) and s.success.dtype == np.float32
  assert np.isnan(s.success).all() != spec.has_success

  np.testing.assert_array_equal(s.truncated, [False, True, False])
  assert s.terminated[2] and not s.terminated[0] and not s.terminated[1]
  assert int(s.nan_resets) == 1 and s.reward[2] == 0.0
  # Env 0 carried on: its obs is the step's obs and nothing was reset.
  np.testing.assert_allclose(s.obs["state"][0], ref_obs["state"][0], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(s.obs["state"][0], s.final_obs["state"][0])
  assert s.steps[0] == 1 and s.ep_length[0] == 1 and s.ep_return[0] == s.reward[0]
  np.testing.assert_array_equal(s.key[0], keys_before[0])
  # Env 1 reached the limit: final_obs is where it ended, obs is a fresh episode.
  np.testing.assert_allclose(s.final_obs["state"][1], ref_obs["state"][1], rtol=1e-5, atol=1e-5)
  # Envs 1 and 2 restarted from the second half of their own key's split.
  for i in (1, 2):
    new_key, reset_key = np.asarray(jax.random.split(keys_before[i]))
    fresh = _host(sim.core.obs(jax.jit(sim.core.reset)(reset_key)))
    np.testing.assert_allclose(s.obs["state"][i], fresh["state"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(s.key[i], new_key)
    assert s.steps[i] == 0 and s.ep_length[i] == 0 and s.ep_return[i] == 0.0
  assert s.done_length[1] == 1 and s.done_return[1] == s.reward[1]


@pytest.mark.parametrize("name", ALL)
def test_episode_figures_accumulate_on_device(name):
  sim = make_device_sim(name, N, max_episode_steps=LIMIT)
  state = sim.reset(jax.random.PRNGKey(1))
  rng = np.random.default_rng(0)
  ret, length, finished = np.zeros(N), np.zeros(N, int), 0
  for _ in range(2 * LIMIT):
    action = rng.uniform(-1, 1, (N, sim.spec.action_dim)).astype(np.float32)
    state = sim.step(state, jnp.asarray(action))
    s = _host(state)
    ret += s.reward
    length += 1
    done = s.done
    np.testing.assert_allclose(s.done_return[done], ret[done], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(s.done_length[done], length[done])
    np.testing.assert_array_equal(s.steps[done], 0)
    np.testing.assert_array_equal(s.steps[~done], length[~done])
    finished += int(done.sum())
    ret[done], length[done] = 0.0, 0
  assert finished >= N  # Every env ended at least one episode (the limit is LIMIT steps).

"""PandaPickCube on both backends: MJX (mjx:PandaPickCube) and EnvPool's CPU port (PandaPickCube-v1).

The documented correspondences (README, "Device simulators") checked here:
- same spec: obs `state` (66,) float32, 8 actions in [-1, 1], 150-step episodes, a success signal;
- same observation layout: qpos (16: 7 arm, 2 fingers, box position and quaternion), qvel (15),
  gripper position (3), gripper rotation rows 2-3 (6), box rotation rows 2-3 (6), box - gripper
  (3), target - box (3), target - box rotation (6), ctrl - robot qpos (8);
- the same home pose at reset (robot joints, box height and orientation, zero velocities); the box
  and target are drawn independently by each backend;
- the same reward: 4 gripper_box + 8 box_target + 0.25 no_floor_collision + 0.3 robot_target_qpos
  (EnvPool's extra terms are zero while the box has not been reached), so the reward recomputed
  from either backend's observation equals the reward it reports.
One known difference: MJX's first observation of an episode holds zeros for the kinematic terms
(gripper and box frames), because Playground builds it before any forward pass; EnvPool computes
them. From the first step on both are complete.

Cost: mostly compiling MJX Panda's batched step (12-18 s of the fixture's 20-29 s on 2 cores with
no compilation cache; JAX's persistent cache brings a rerun under ~10 s). The checks after a step
need it, so the default suite compiles it once, for one env per backend; the same checks on 4
envs, which also see each backend draw a different box per env, compile again and are marked slow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sim_adapters.base import gather_all
from sim_adapters.mjx import make_device_sim

QPOS, QVEL, GRIPPER, BOX_MINUS_GRIPPER = slice(0, 16), slice(16, 31), slice(31, 34), slice(46, 49)
ROBOT, ARM, BOX_POS, BOX_QUAT = slice(0, 9), slice(0, 7), slice(9, 12), slice(12, 16)


def reward_from_obs(obs: np.ndarray, home_arm: np.ndarray) -> np.ndarray:
  """The shaped reward before the box is reached, from the observation alone."""
  gripper_box = 1.0 - np.tanh(5.0 * np.linalg.norm(obs[:, BOX_MINUS_GRIPPER], axis=1))
  robot_target_qpos = 1.0 - np.tanh(np.linalg.norm(obs[:, ARM] - home_arm, axis=1))
  no_floor_collision = 1.0
  return 4.0 * gripper_box + 0.25 * no_floor_collision + 0.3 * robot_target_qpos


@pytest.fixture(scope="module", params=[1, pytest.param(4, marks=pytest.mark.slow)], ids=lambda n: f"{n}env")
def both(request):
  """Reset and one zero-action step of `n` envs on each backend (one compile of MJX's reset and step)."""
  from sim_adapters import make_adapter

  n = request.param
  host = make_adapter("PandaPickCube-v1", n, seed=0)
  host.reset()
  host_first = gather_all(host, n)
  host_next = host.step(np.zeros((n, 8), np.float32))
  host.close()
  sim = make_device_sim("mjx:PandaPickCube", n)
  first = sim.reset(jax.random.PRNGKey(0))
  dev_first = {k: np.asarray(v) for k, v in first.obs.items()}
  nxt = jax.device_get(sim.step(first, jnp.zeros((n, 8))))
  return host.spec, sim.spec, host_first, host_next, dev_first, nxt


def test_same_spec(both):
  host_spec, dev_spec = both[:2]
  assert {k: (v.shape, v.dtype) for k, v in host_spec.obs.items()} == \
         {k: (v.shape, v.dtype) for k, v in dev_spec.obs.items()} == {"state": ((66,), np.float32)}
  assert host_spec.action_dim == dev_spec.action_dim == 8
  np.testing.assert_array_equal(host_spec.action_low, dev_spec.action_low)
  np.testing.assert_array_equal(host_spec.action_high, dev_spec.action_high)
  assert host_spec.max_episode_steps == dev_spec.max_episode_steps == 150
  assert host_spec.has_success and dev_spec.has_success


def test_same_home_pose_at_reset(both):
  _, _, host_first, _, dev_first, _ = both
  h, d = host_first.obs["state"], dev_first["state"]
  np.testing.assert_allclose(h[:, ROBOT], d[:, ROBOT], atol=1e-5)
  np.testing.assert_allclose(h[:, BOX_POS][:, 2], d[:, BOX_POS][:, 2], atol=1e-5)
  np.testing.assert_allclose(h[:, BOX_QUAT], d[:, BOX_QUAT], atol=1e-5)
  np.testing.assert_array_equal(h[:, QVEL], 0.0)
  np.testing.assert_array_equal(d[:, QVEL], 0.0)
  # Box and target are drawn by each backend; the box starts on the table near the robot, a
  # different place in each env.
  assert (np.abs(d[:, BOX_POS][:, :2] - h[:, BOX_POS][:, :2]) < 0.45).all()
  for obs in (h, d):
    assert len(np.unique(obs[:, BOX_POS][:, 0])) == len(obs)
  # MJX's first observation has no kinematics yet (see the module docstring).
  np.testing.assert_array_equal(d[:, GRIPPER], 0.0)
  assert (np.abs(h[:, GRIPPER]) > 0).any()


def test_same_layout_and_reward_after_one_step(both):
  _, _, host_first, host_next, dev_first, nxt = both
  home_arm = host_first.obs["state"][0, ARM]
  for obs, reward in ((host_next.obs["state"], host_next.reward), (np.asarray(nxt.obs["state"]), nxt.reward)):
    np.testing.assert_allclose(obs[:, BOX_MINUS_GRIPPER], obs[:, BOX_POS] - obs[:, GRIPPER], atol=1e-4)
    np.testing.assert_allclose(reward, reward_from_obs(obs, home_arm), atol=1e-4)
    assert ((0.25 < reward) & (reward < 4.55)).all()
  # With zero actions the arm moves the same way on both (it touches nothing yet).
  np.testing.assert_allclose(host_next.obs["state"][:, GRIPPER], np.asarray(nxt.obs["state"])[:, GRIPPER],
                             atol=2e-3)
  np.testing.assert_allclose(host_next.obs["state"][:, ROBOT], np.asarray(nxt.obs["state"])[:, ROBOT], atol=2e-3)
  np.testing.assert_array_equal(host_next.success, 0.0)
  np.testing.assert_array_equal(np.asarray(nxt.success), 0.0)

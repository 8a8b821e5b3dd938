"""EBRL's EnvPool adapter, reset rows removed, is the env a same-call reset gives.

EBRL lets EnvPool reset an env on the call after its episode ended (a `reset_step` row the
learner masks); Stable-Baselines3's harness resets done envs explicitly in the same call. If the
automatic reset left any state behind (a dial's angle, a joint's velocity), EBRL's episodes would
start elsewhere than the peer's and learning could not be compared. Here a controller that pushes
MetaWorld's dial drives both for two episode boundaries with the same actions: every observation
and reward must agree exactly.
"""

from __future__ import annotations

import numpy as np

from sim_adapters import make_adapter

TASK, N, STEPS = "MetaWorld/DialTurn-v3", 3, 1_050  # Two episode ends (500 steps each).


def _controller(obs: np.ndarray, t: int) -> np.ndarray:
  """Hand to beside the dial's handle, then through it: the dial turns (checked below)."""
  side = -0.05 if t % 500 < 150 else 0.05
  target = obs[:, 4:7] + np.array([side, 0.0, 0.0])
  act = np.zeros((obs.shape[0], 4), np.float32)
  act[:, :3] = np.clip(10.0 * (target - obs[:, 0:3]), -1.0, 1.0)
  return act


def test_the_automatic_reset_equals_an_explicit_one():
  import envpool  # pylint: disable=g-import-not-at-top
  adapter = make_adapter(TASK, N, num_threads=1, seed=3)
  adapter.reset()
  first = adapter.recv()
  ours_obs, ours_rew = [first.obs["state"]], []
  t = 0
  obs = first.obs["state"]
  while t < STEPS:
    b = adapter.step(_controller(obs, t))
    obs = b.obs["state"]
    if b.reset_step.any():
      assert b.reset_step.all()  # Every env ends its episode on the same step here.
      ours_obs[-1] = obs  # The reset row: the new episode's first observation.
      continue
    ours_obs.append(obs)
    ours_rew.append(b.reward)
    t += 1
  adapter.close()

  pool = envpool.make(TASK, env_type="gymnasium", num_envs=N, batch_size=N, num_threads=1, seed=3,
                      partially_observable=False)
  obs = pool.reset()[0]
  ref_obs, ref_rew, ids = [obs.astype(np.float32)], [], np.arange(N, dtype=np.int32)
  for t in range(STEPS):
    obs, rew, term, trunc, _ = pool.step(_controller(obs.astype(np.float32), t), ids)
    if (term | trunc).any():
      ref_rew.append(rew)
      reset_obs, info = pool.reset(np.flatnonzero(term | trunc).astype(np.int32))
      obs = obs.copy()
      obs[info["env_id"]] = reset_obs
    else:
      ref_rew.append(rew)
    ref_obs.append(obs.astype(np.float32))
  pool.close()

  ours_obs, ref_obs = np.stack(ours_obs), np.stack(ref_obs)
  assert ours_obs.shape == ref_obs.shape == (STEPS + 1, N, 39)
  np.testing.assert_array_equal(ours_obs, ref_obs)
  np.testing.assert_array_equal(np.stack(ours_rew), np.stack(ref_rew).astype(np.float32))
  # Not vacuous: the dial moved within the first episode, and the second started elsewhere.
  assert np.abs(ours_obs[:500, :, 4:7] - ours_obs[0, :, 4:7]).max() > 0.005
  assert np.abs(ours_obs[500, :, 4:7] - ours_obs[0, :, 4:7]).max() > 0.01

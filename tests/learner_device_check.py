"""Runs two learner updates on every local device and saves the resulting params.

Used by tests/learner/test_learner.py::test_update_same_on_1_and_4_devices, which runs
this script twice in fresh processes (JAX fixes the device count at start-up):
once with XLA_FLAGS=--xla_force_host_platform_device_count=4 and once without.

  python tests/learner_device_check.py OUT.npz EXPECTED_DEVICE_COUNT

Everything is built from fixed seeds, so both runs do the same arithmetic up to
the order of the cross-device sums. Prints `key=value` lines the test checks.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import device_count  # pylint: disable=g-import-not-at-top
import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from ebrl.algorithms.ppo import PPOConfig
from ebrl.learner import Learner, LearnerConfig
from ebrl.types import Rollout
from policies.mlp import MLPPolicy
from sim_adapters.base import EnvSpec, ObsSpec

T, N, OBS_DIM, ACTION_DIM = 8, 4, 5, 2

CONFIG = LearnerConfig(gamma=0.95, gae_lambda=0.9, epochs=2, num_minibatches=2, learning_rate=3e-3,
                       max_grad_norm=0.5, reward_scale=1.5,
                       ppo=PPOConfig(clip_eps=0.2, value_clip_eps=0.2, ent_coef=0.01))


def make_spec() -> EnvSpec:
  return EnvSpec(name="tiny", obs={"state": ObsSpec((OBS_DIM,), np.float32)}, action_dim=ACTION_DIM,
                 action_low=-np.ones(ACTION_DIM, np.float32), action_high=np.ones(ACTION_DIM, np.float32),
                 max_episode_steps=10, has_success=False)


def make_rollout(policy: MLPPolicy, params, seed: int, p_end: float = 0.15, n: int = N) -> Rollout:
  """A random [T, N] rollout whose logp/values are the given policy's.

  Each valid step terminates or truncates with probability p_end; the step after
  an episode end is an (invalid) automatic-reset step, as EnvPool produces.
  """
  rng = np.random.default_rng(seed)
  obs = rng.normal(1.0, 2.0, (T + 1, n, OBS_DIM)).astype(np.float32)
  actions = rng.normal(0.0, 0.7, (T + 1, n, ACTION_DIM)).astype(np.float32)
  terminated = np.zeros((T, n), bool)
  done = np.zeros((T, n), bool)
  valid = np.ones((T, n), bool)
  for t in range(T):
    if t > 0:
      valid[t] = ~done[t - 1]  # the step after an episode end is an automatic reset
    term = (rng.random(n) < p_end) & valid[t]
    trunc = (rng.random(n) < p_end) & valid[t] & ~term
    terminated[t], done[t] = term, term | trunc
  rewards = np.where(valid, rng.normal(0.0, 1.0, (T, n)), 0.0).astype(np.float32)
  logp, _, values = jax.jit(policy.evaluate)(params, {"state": obs}, actions)
  return Rollout(obs={"state": obs[:T]}, actions=actions[:T], logp=np.asarray(logp)[:T],
                 values=np.asarray(values), rewards=rewards, terminated=terminated, done=done,
                 valid=valid, version=np.zeros((T, n), np.int32))


def flat_params(params) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def main(out_path: str, expected: int) -> None:
  count = device_count.start(expected)

  policy = MLPPolicy(make_spec(), hidden=(16, 16))
  learner = Learner(policy, CONFIG)
  assert learner.mesh.devices.size == count
  state = learner.init(jax.random.key(0))
  params0 = jax.device_get(state.params)
  rollouts = [make_rollout(policy, params0, seed) for seed in (1, 2)]

  placed = learner.place(rollouts[0])
  sharding = placed.rewards.sharding
  shard_shapes = sorted({tuple(s.data.shape) for s in placed.rewards.addressable_shards})
  print(f"rewards_sharding_devices={len(sharding.device_set)}")
  print(f"rewards_shard_shapes={shard_shapes}")
  print(f"obs_shard_shapes={sorted({tuple(s.data.shape) for s in placed.obs['state'].addressable_shards})}")

  metrics = []
  for ro in rollouts:
    state, m = learner.update(state, ro)
    metrics.append({k: float(v) for k, v in m.items()})
  net_leaf = jax.tree.leaves(state.params["net"])[0]
  print(f"params_sharding_devices={len(net_leaf.sharding.device_set)}")
  print(f"params_fully_replicated={net_leaf.sharding.is_fully_replicated}")
  print(f"version={int(state.version)} skipped_updates={int(state.skipped_updates)}")

  out = flat_params(jax.device_get(state.params))
  for i, m in enumerate(metrics):
    out.update({f"metric{i}/{k}": np.asarray(v) for k, v in m.items()})
  out["changed"] = np.asarray(max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(params0["net"]), jax.tree.leaves(jax.device_get(state.params["net"])))))
  np.savez(out_path, **out)
  print("ok")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))

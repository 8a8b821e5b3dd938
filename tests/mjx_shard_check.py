"""Runs a fused device rollout with the envs sharded over every local device; saves the trajectory.

Used by tests/sim_adapters/test_mjx_sharding.py, which runs this script in fresh processes
(JAX fixes the device count at start-up): once with
XLA_FLAGS=--xla_force_host_platform_device_count=4 and once without.

  python tests/mjx_shard_check.py OUT.npz EXPECTED_DEVICE_COUNT

Envs, params and keys come from fixed seeds; episodes are 4 steps long so
auto-resets happen inside the rollout. Prints `key=value` lines the test checks.
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

from ebrl import normalizer
from ebrl.scheduler.device_sync import make_collect
from policies.mlp import MLPPolicy
from sim_adapters.mjx import make_device_sim
from sim_adapters.mjx.device_sim import make_sim_mesh

NUM_ENVS, HORIZON, EPISODE = 8, 6, 4


def main(out_path: str, expected: int) -> None:
  device_count.start(expected)

  sim = make_device_sim("mjx:CartpoleBalance", NUM_ENVS, max_episode_steps=EPISODE, mesh=make_sim_mesh())
  policy = MLPPolicy(sim.spec, hidden=(16, 16))
  params = {**policy.init(jax.random.PRNGKey(3)), "value_norm": normalizer.init_stats(1)}  # As acting_params.
  params = jax.device_put(params, jax.sharding.NamedSharding(sim.mesh, jax.sharding.PartitionSpec()))
  collect = make_collect(sim, policy, HORIZON, gamma=0.99)
  state = sim.reset(jax.random.PRNGKey(0))
  print(f"state_sharding_devices={len(state.obs['state'].sharding.device_set)}")
  out = {}
  for i in range(2):
    state, rollout, finished = collect(params, state, jax.random.PRNGKey(10 + i), 0)
    print(f"rollout_obs_shards={sorted({tuple(s.data.shape) for s in rollout.obs['state'].addressable_shards})}")
    r = jax.device_get(rollout)
    out.update({f"r{i}/obs": r.obs["state"], f"r{i}/actions": r.actions, f"r{i}/rewards": r.rewards,
                f"r{i}/done": r.done, f"r{i}/values": r.values, f"r{i}/logp": r.logp,
                f"r{i}/done_return": np.asarray(finished.ret)})
  out["episodes"] = np.asarray(sum(int(np.asarray(out[f"r{i}/done"]).sum()) for i in range(2)))
  np.savez(out_path, **out)
  print("ok")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))

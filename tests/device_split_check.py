"""Runs generation and an update under every stage placement on 4 CPU devices, saving the results.

Used by tests/learner/test_device_split.py, which runs it in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=4 (JAX fixes the device count
at start-up). For each placement of config.devices (unsplit, 1+3, 2+2, shared)
it builds the learner over its training devices and the sampler over its
generation devices, exactly as the Trainer does, publishes the initial params
through a ParamStore, samples actions for a fixed batch with a fixed key, then
applies one update to a fixed rollout. Prints where each array lives.

  python tests/device_split_check.py OUT.npz
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import device_count  # pylint: disable=g-import-not-at-top
import jax  # pylint: disable=g-import-not-at-top
import ml_collections
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ebrl.learner import Learner, make_mesh
from ebrl.param_store import ParamStore
from ebrl.resources import devices as devices_lib
from ebrl.sampler import Sampler
from learner_device_check import CONFIG, flat_params, make_rollout, make_spec
from policies.mlp import MLPPolicy

# name -> config.devices; N=12 envs divide over 1, 2, 3 and 4 devices.
PLACEMENTS = {
    "unsplit": {"gen": "", "train": ""},
    "split_1_3": {"gen": "1", "train": "3"},
    "split_2_2": {"gen": "2", "train": "2"},
    "shared": {"gen": "0,1,2,3", "train": "0,1,2,3"},
}
BATCH = 12


def run(name: str, setting: dict, policy, rollout, obs) -> dict[str, np.ndarray]:
  placement = devices_lib.resolve(ml_collections.ConfigDict({**setting, "sim": ""}), jax.local_device_count(),
                                  device_env=False)
  local = jax.local_devices()
  learner = Learner(policy, CONFIG, mesh=make_mesh([local[i] for i in placement.train]))
  gen_mesh = make_mesh([local[i] for i in placement.gen])
  store = ParamStore(place=lambda p: jax.device_put(p, NamedSharding(gen_mesh, P())))
  sampler = Sampler(policy, make_spec(), store, seed=7, mesh=gen_mesh)
  state = learner.init(jax.random.key(0))
  store.publish(state)
  published = jax.tree.leaves(store.latest()[0])[0]
  actions, _ = sampler.act(obs)
  state, _ = learner.update(state, rollout)
  trained = jax.tree.leaves(state.params["net"])[0]
  ids = lambda arr: sorted(d.id for d in arr.sharding.device_set)
  print(f"{name} placement={placement.to_dict()} published_on={ids(published)} trained_on={ids(trained)}")
  out = {f"{name}/params/{k}": v for k, v in flat_params(jax.device_get(state.params)).items()}
  out.update({f"{name}/action": actions.action, f"{name}/logp": actions.logp, f"{name}/value": actions.value})
  return out


def main(out_path: str) -> None:
  device_count.start(4)
  policy = MLPPolicy(make_spec(), hidden=(16, 16))
  params0 = jax.device_get(Learner(policy, CONFIG, mesh=make_mesh(jax.local_devices()[:1])).init(
      jax.random.key(0)).params)
  rollout = make_rollout(policy, params0, seed=3, n=BATCH)
  obs = {"state": np.random.default_rng(5).normal(size=(BATCH, rollout.obs["state"].shape[-1])).astype(np.float32)}
  out = {}
  for name, setting in PLACEMENTS.items():
    out.update(run(name, setting, policy, rollout, obs))
  np.savez(out_path, **out)
  print("ok")


if __name__ == "__main__":
  main(sys.argv[1])

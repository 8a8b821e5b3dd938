"""Two learner updates over a mesh of every process's devices; saves the resulting params.

Used by tests/learner/test_distributed.py, which runs it as one process with 2
CPU devices, and as 2 processes of 1 device each joined through
jax.distributed (gloo), on the same global batch: each of the 2 processes
gives its own env columns, as every process of a multi-process run does.

  python tests/distributed_update_check.py OUT.npz NUM_PROCESSES PROCESS_ID COORDINATOR

Prints `key=value` lines the test checks.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.dirname(os.path.abspath(__file__))):
  if path not in sys.path:
    sys.path.insert(0, path)

from ebrl import distributed  # pylint: disable=g-import-not-at-top


def main(out_path: str, num_processes: int, process_id: int, coordinator: str) -> None:
  identity = distributed.ProcessIdentity(coordinator, num_processes, process_id, connect_timeout_s=60) \
      if num_processes > 1 else distributed.ProcessIdentity()
  processes = distributed.initialize(identity)  # Before anything starts JAX's backend.

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  import device_count  # pylint: disable=g-import-not-at-top
  import learner_device_check as check  # pylint: disable=g-import-not-at-top
  from ebrl.learner import Learner, make_mesh, process_local  # pylint: disable=g-import-not-at-top
  from policies.mlp import MLPPolicy  # pylint: disable=g-import-not-at-top

  device_count.start(2 // processes)
  print(f"process_count={jax.process_count()} process_index={jax.process_index()}")
  policy = MLPPolicy(check.make_spec(), hidden=(16, 16))
  learner = Learner(policy, check.CONFIG, mesh=make_mesh(jax.devices()))
  state = learner.init(jax.random.key(0))
  params0 = jax.device_get(process_local(state.params))
  columns = slice(process_id * check.N // processes, (process_id + 1) * check.N // processes)
  for seed in (1, 2):
    rollout = check.make_rollout(policy, params0, seed)
    mine = jax.tree.map(lambda x: x[:, columns], rollout)  # This process's envs.
    if seed == 1:
      print(f"local_rewards_shape={mine.rewards.shape} global_rewards_shape={learner.place(mine).rewards.shape}")
    state, _ = learner.update(state, mine)
  print(f"version={int(state.version)}")
  local = jax.device_get(process_local(state.params))
  out = check.flat_params(local)
  out["changed"] = np.asarray(max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(params0["net"]), jax.tree.leaves(local["net"]))))
  np.savez(out_path, **out)
  print("ok")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

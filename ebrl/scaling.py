"""What a learner over several hosts all-reduces per update, per policy, and on paper how far it scales.

A data-parallel update (ebrl/learner.py over a mesh of every process's devices)
all-reduces the gradient of the trainable parameters once per optimiser step:
`epochs * num_minibatches` times per update, 4 bytes per float32 parameter
(the statistics and metrics it also reduces are a few hundred bytes). `measure`
builds a run as the config says (the policy on its env below, its batch),
counts those bytes, and times the update on this machine's devices (the first,
compiling, not timed). On paper, with the global batch fixed and split over P
hosts, each host computes 1/P of the update while a ring all-reduce sends
2 (P - 1) / P of the bytes through its link; the all-reduce stays within 10% of
the update while P <= 1 + 0.05 * update_s * bandwidth / bytes (latency left
out: it only lowers P). `python -m launch.scaling` prints the table.
"""

from __future__ import annotations

import os
import tempfile

# Each policy on the env it is used with (README's recipes): pixels for the cnn, the ten MT10
# tasks for the instruction-conditioned vla and the flow.
POLICY_ENVS = {"mlp": ("MetaWorld/Reach-v3", {}),
               "cnn": ("MetaWorld/Reach-v3", {"env.from_pixels": True, "env.render_stage": True}),
               "vla": ("MetaWorld/MT10", {}),
               "flow": ("MetaWorld/MT10", {"policy.chunk_size": 4})}
LINKS_GBPS = (25.0, 100.0)


def hosts_within(update_s: float, allreduce_bytes: float, gbps: float, share: float = 0.1) -> float:
  """The most hosts P whose ring all-reduce of `allreduce_bytes` over `gbps` stays within `share`
  of the update's compute, which P hosts split: 2 (P - 1) / P * bytes / bw <= share * update_s / P."""
  per_byte_s = 8.0 / (gbps * 1e9)
  return 1.0 + share * update_s / (2.0 * allreduce_bytes * per_byte_s)


def measure(cfg, seconds: float) -> dict:
  """The parameters, all-reduced bytes per update and timed update of the run `cfg` describes
  (a run config: the policy and env set, as launch/scaling.py sets them from POLICY_ENVS)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from ebrl.resources.profiler import measure_train  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as workdir:
    trainer = Trainer(cfg, os.path.join(workdir, "run"), progress=False)
    try:
      run, learner = trainer.run_spec, trainer.learner
      params = int(sum(np.size(x) for x in jax.tree.leaves(trainer.state.params["net"])))
      steps = learner.cfg.epochs * learner.cfg.num_minibatches
      timed = measure_train(learner, trainer.stages.spec, run.rollout_length, [trainer.layout.num_envs], seconds)[0]
    finally:
      trainer.abort()
  allreduce = 4 * params * steps
  return {"policy": run.policy.name, "env": run.env.name, "params": params, "optimizer_steps_per_update": steps,
          "allreduce_bytes_per_update": allreduce, "samples_per_update": timed["samples"],
          "update_s": timed["wall_s"],
          "hosts_within_10pct": {f"{g:g}Gbps": hosts_within(timed["wall_s"], allreduce, g) for g in LINKS_GBPS}}

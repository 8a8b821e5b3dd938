"""What a learner over several hosts all-reduces per update, per policy, and on paper how far it scales.

  python -m launch.scaling --policies=mlp,cnn,vla,flow --out=scaling.json

A data-parallel update (ebrl/learner.py over a mesh of every process's devices)
all-reduces the gradient of the trainable parameters once per optimiser step:
`epochs * num_minibatches` times per update, 4 bytes per float32 parameter
(the statistics and metrics it also reduces are a few hundred bytes). For each
policy this builds a run as the config says (the policy's env below, its
batch), counts those bytes, and times the update on this machine's devices
(the first, compiling, not timed). On paper, with the global batch fixed and
split over P hosts, each host computes 1/P of the update while a ring
all-reduce sends 2 (P - 1) / P of the bytes through its link; the all-reduce
stays within 10% of the update while P <= 1 + 0.05 * update_s * bandwidth /
bytes (latency left out: it only lowers P).
"""

from __future__ import annotations

import json
import math
import os
import tempfile

from absl import flags

from launch import common

# Each policy on the env it is used with (README's recipes): pixels for the cnn, the ten MT10
# tasks for the instruction-conditioned vla and the flow.
POLICY_ENVS = {"mlp": ("MetaWorld/Reach-v3", {}), "cnn": ("MetaWorld/Reach-v3", {"env.from_pixels": True, "env.render_stage": True}),
               "vla": ("MetaWorld/MT10", {}), "flow": ("MetaWorld/MT10", {"policy.chunk_size": 4})}
LINKS_GBPS = (25.0, 100.0)

_POLICIES = flags.DEFINE_list("policies", list(POLICY_ENVS), f"Policies to measure: {', '.join(POLICY_ENVS)}.")
_SECONDS = flags.DEFINE_float("seconds", 3.0, "Timed seconds of updates per policy (at least one update).")
_OUT = flags.DEFINE_string("out", "scaling.json", "Where to write the JSON.")
_CONFIG = common.define_config(help_text="Base run config; --config.<key>=<value> overrides apply to every policy.")


def hosts_within(update_s: float, allreduce_bytes: float, gbps: float, share: float = 0.1) -> float:
  """The most hosts P whose ring all-reduce of `allreduce_bytes` over `gbps` stays within `share`
  of the update's compute, which P hosts split: 2 (P - 1) / P * bytes / bw <= share * update_s / P."""
  per_byte_s = 8.0 / (gbps * 1e9)
  return 1.0 + share * update_s / (2.0 * allreduce_bytes * per_byte_s)


def measure(cfg, policy: str, seconds: float) -> dict:
  """One policy's parameters, all-reduced bytes per update and timed update."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from ebrl.resources.profiler import measure_train  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer  # pylint: disable=g-import-not-at-top

  env, extra = POLICY_ENVS[policy]
  cfg = cfg.copy_and_resolve_references()
  cfg.env.name, cfg.policy.name = env, policy
  for key, value in extra.items():
    section, leaf = key.split(".")
    cfg[section][leaf] = value
  with tempfile.TemporaryDirectory() as workdir:
    trainer = Trainer(cfg, os.path.join(workdir, "run"), progress=False)
    try:
      learner, spec, layout = trainer.learner, trainer.stages.spec, trainer.layout
      params = int(sum(np.size(x) for x in jax.tree.leaves(trainer.state.params["net"])))
      steps = learner.cfg.epochs * learner.cfg.num_minibatches
      horizon = trainer.run_spec.rollout_length
      timed = measure_train(learner, spec, horizon, [layout.num_envs], seconds)[0]
    finally:
      trainer.abort()
  allreduce = 4 * params * steps
  return {"policy": policy, "env": env, "params": params, "optimizer_steps_per_update": steps,
          "allreduce_bytes_per_update": allreduce, "samples_per_update": timed["samples"],
          "update_s": timed["wall_s"],
          "hosts_within_10pct": {f"{g:g}Gbps": hosts_within(timed["wall_s"], allreduce, g) for g in LINKS_GBPS}}


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> and --config.<key>=<value> flags")
  unknown = [p for p in _POLICIES.value if p not in POLICY_ENVS]
  if unknown or not _POLICIES.value:
    common.fail(f"--policies={','.join(_POLICIES.value)}: choose from {', '.join(POLICY_ENVS)}")
  if not math.isfinite(_SECONDS.value) or _SECONDS.value <= 0:
    common.fail(f"--seconds={_SECONDS.value} must be a finite number > 0")
  common.check_output_file("out", _OUT.value)
  cfg = common.config_value(_CONFIG)
  common.enable_compilation_cache()
  rows = []
  print("| policy | env | params | optimiser steps / update | all-reduced MB / update | update s | hosts within 10%: "
        + " | ".join(f"{g:g} Gb/s" for g in LINKS_GBPS) + " |", flush=True)
  for policy in _POLICIES.value:
    row = measure(cfg, policy, _SECONDS.value)
    rows.append(row)
    hosts = " | ".join(f"{v:,.0f}" for v in row["hosts_within_10pct"].values())
    print(f"| {policy} | {row['env']} | {row['params']:,} | {row['optimizer_steps_per_update']} | "
          f"{row['allreduce_bytes_per_update'] / 1e6:,.2f} | {row['update_s']:.3f} | {hosts} |", flush=True)
  with open(_OUT.value, "w") as f:
    json.dump({"machine": common.machine_info(), "rows": rows}, f, indent=1)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  common.run(main)

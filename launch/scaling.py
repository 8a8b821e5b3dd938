"""Per policy, the bytes a learner over several hosts all-reduces per update and the hosts it scales to.

  python -m launch.scaling --policies=mlp,cnn,vla,flow --out=scaling.json

A thin absl wrapper over ebrl/scaling.py (which documents the formula).
"""

from __future__ import annotations

import json
import math

from absl import flags

from launch import common

_POLICIES = flags.DEFINE_list("policies", ["mlp", "cnn", "vla", "flow"], "Policies to measure: mlp, cnn, vla, flow.")
_SECONDS = flags.DEFINE_float("seconds", 3.0, "Timed seconds of updates per policy (at least one update).")
_OUT = flags.DEFINE_string("out", "scaling.json", "Where to write the JSON.")
_CONFIG = common.define_config(help_text="Base run config; --config.<key>=<value> overrides apply to every policy.")


def policy_config(cfg, policy: str, policy_envs: dict):
  """`cfg` with `policy` on its env and settings (ebrl/scaling.py's POLICY_ENVS)."""
  env, extra = policy_envs[policy]
  cfg = cfg.copy_and_resolve_references()
  cfg.env.name, cfg.policy.name = env, policy
  for key, value in extra.items():
    section, leaf = key.split(".")
    cfg[section][leaf] = value
  return cfg


def main(argv: list[str]) -> None:
  from ebrl import scaling  # pylint: disable=g-import-not-at-top

  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> and --config.<key>=<value> flags")
  unknown = [p for p in _POLICIES.value if p not in scaling.POLICY_ENVS]
  if unknown or not _POLICIES.value:
    common.fail(f"--policies={','.join(_POLICIES.value)}: choose from {', '.join(scaling.POLICY_ENVS)}")
  if not math.isfinite(_SECONDS.value) or _SECONDS.value <= 0:
    common.fail(f"--seconds={_SECONDS.value} must be a finite number > 0")
  common.check_output_file("out", _OUT.value)
  cfg = common.config_value(_CONFIG)
  common.enable_compilation_cache()
  rows = []
  print("| policy | env | params | optimiser steps / update | all-reduced MB / update | update s | hosts within 10%: "
        + " | ".join(f"{g:g} Gb/s" for g in scaling.LINKS_GBPS) + " |", flush=True)
  for policy in _POLICIES.value:
    row = scaling.measure(policy_config(cfg, policy, scaling.POLICY_ENVS), _SECONDS.value)
    rows.append(row)
    hosts = " | ".join(f"{v:,.0f}" for v in row["hosts_within_10pct"].values())
    print(f"| {policy} | {row['env']} | {row['params']:,} | {row['optimizer_steps_per_update']} | "
          f"{row['allreduce_bytes_per_update'] / 1e6:,.2f} | {row['update_s']:.3f} | {hosts} |", flush=True)
  with open(_OUT.value, "w") as f:
    json.dump({"machine": common.machine_info(), "rows": rows}, f, indent=1)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  common.run(main)

"""Profiles every stage on this machine: the measured costs, the plan, the bound and the bottleneck.

profile.json has top-level keys `profile` (measured stage costs), `plan` (what
resources=auto would run), `bound` (the work-conserving bound: the best rate
any schedule of these stage costs reaches on these cores), `bottleneck`, and
`inventory`. A run plans from it with quotas.profile=<that file>.
`ebrl.profile` and `python -m launch.profile` both call `run_profile`.
"""

from __future__ import annotations

import math
from typing import Callable

from ebrl import validation
from ebrl import workdir as workdir_lib
from ebrl.errors import UserError


def check(seconds: float, num_envs: int | None) -> None:
  """The profiler's own values, before any env is built or timed: a nan or inf `seconds` would time
  a measurement point forever."""
  if not math.isfinite(seconds) or seconds <= 0:
    raise UserError(f"seconds={seconds} must be a finite number > 0 (timed seconds per measurement point)")
  if num_envs is not None and num_envs <= 0:
    raise UserError(f"num_envs={num_envs} must be a positive integer (or left out for the config's)")


def plan_lines(prof, plan, bound: dict, num_cores: int) -> list[str]:
  """The measured stage costs, the plan resources=auto would run, and the work-conserving bound."""
  lines = [f"\nprofile ({prof.measured_s:.1f} s):"]
  for p in prof.sim:
    lines.append(f"  sim   threads {p['threads']:>2}  batch {p['batch']:>5}  {p['env_steps_per_s']:>10,.0f} steps/s"
                 f"  {p['cpu_us_per_step']:>7.1f} us CPU/step")
  for p in prof.gen:
    lines.append(f"  gen   batch {p['batch']:>5}  {p['wall_us']:>9.1f} us/call  {p['cpu_us']:>9.1f} us CPU/call")
  for p in prof.train:
    lines.append(f"  train {p['samples']:>7} samples  {p['wall_s'] * 1e3:>8.1f} ms/update  "
                 f"{p['cpu_s'] * 1e3:>8.1f} ms CPU")
  for p in prof.assemble:
    lines.append(f"  assemble batch {p['batch']:>5}  {p['cpu_us']:>8.1f} us/batch")
  for p in prof.render or ():
    lines.append(f"  render batch {p['batch']:>5}  {p['wall_us'] / 1e3:>8.2f} ms/draw  {p['cpu_us'] / 1e3:>8.2f} ms CPU")
  lines.append("\nplan:")
  for stage, cores in plan.cpu_sets.items():
    lines.append(f"  {stage:<9} cores {list(cores)}  cost {plan.stage_cost_us[stage]:7.1f} us/step  "
                 f"rate {plan.predicted_rates[stage]:>10,.0f} steps/s")
  lines.append(f"  groups {plan.num_groups}, recv batch {plan.recv_batch}, gen batch {plan.max_gen_batch}, "
               f"EnvPool threads/pool {plan.sim_threads}, affinity offset {plan.thread_affinity_offset}")
  lines.append(f"  predicted {plan.predicted_env_steps_per_s:,.0f} env steps/s; bottleneck {plan.bottleneck}")
  lines.append(f"  work-conserving bound {bound['env_steps_per_s']:,.0f} env steps/s "
               f"({bound['cpu_us_per_step']:.1f} us CPU/step on {num_cores} cores)")
  lines += [f"  {note}" for note in plan.notes]
  return lines


def run_profile(cfg, *, env: str, policy: str, num_envs: int | None = None, seconds: float = 0.5,
                out: str | None = None, log: Callable[[str], None] = print) -> dict:
  """Measures `cfg` (a full run config) with `env`, `policy` and `num_envs` set; returns profile.json's
  content, also written to `out` when given."""
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import runtime
  from ebrl.resources import planner, profiler
  from ebrl.resources.inventory import take_inventory
  from ebrl.resources.manager import gpu_note
  from ebrl.telemetry.writers import write_json

  check(seconds, num_envs)
  cfg = cfg.copy_and_resolve_references()
  cfg.env.name, cfg.policy.name, cfg.scheduler = env, policy, "ebrl"
  if num_envs is not None:
    cfg.num_envs = num_envs
  run = validation.resolve(cfg)
  validation.check_devices(run, jax.local_device_count())
  if run.device_env:
    raise UserError(f"env '{cfg.env.name}' is a device simulator; the profiler plans host env stages "
                    "(MetaWorld/..., EnvPool ids)")
  if out:
    workdir_lib.check_output_file("out", out)  # An unwritable out would lose every measurement.
  runtime.enable_compilation_cache()
  inv = take_inventory()
  for line in inv.summary_lines():
    log(line)
  prof = profiler.measure(run, inv, full=True, seconds=seconds)
  shape = planner.RunShape.of(run)
  plan = planner.plan_auto(prof, inv.cpu_cores, shape, (gpu_note(inv),))
  bound = planner.work_conserving_bound(prof, inv.cpu_cores, shape)
  for line in plan_lines(prof, plan, bound, len(inv.cpu_cores)):
    log(line)
  result = {"profile": prof.to_dict(), "plan": plan.to_dict(), "bound": bound, "bottleneck": plan.bottleneck,
            "inventory": inv.to_dict()}
  if out:
    write_json(out, result)
    log(f"written {out}")
  return result

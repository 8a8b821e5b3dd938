"""Profiles every stage on this machine and prints the plan, the bound and the bottleneck.

  python -m launch.profile --env=MetaWorld/MT10 --policy=mlp --num_envs=160 --out=profile.json

profile.json has top-level keys `profile` (measured stage costs), `plan` (what
resources=auto would run), `bound` (the work-conserving bound: the best rate
any schedule of these stage costs reaches on these cores), `bottleneck`, and
`inventory`. Pass it to a run with --config.quotas.profile=profile.json.
"""

from __future__ import annotations

import math

from absl import flags

from launch import common

_ENV = flags.DEFINE_string("env", "MetaWorld/Reach-v3", "Env name.")
_POLICY = flags.DEFINE_string("policy", "mlp", "Policy name.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "Envs (default: the config's).")
_OUT = flags.DEFINE_string("out", "profile.json", "Where to write the profile and plan.")
_SECONDS = flags.DEFINE_float("seconds", 0.5, "Timed seconds per measurement point.")
_CONFIG = common.define_config(help_text="Base run config; --config.<key>=<value> overrides apply.")


def _check_flags() -> None:
  """The profiler's own flags, before any env is built or timed: a nan or inf --seconds
  would time a measurement point forever."""
  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top

  if not math.isfinite(_SECONDS.value) or _SECONDS.value <= 0:
    raise UserError(f"--seconds={_SECONDS.value} must be a finite number > 0 (timed seconds per measurement point)")
  if _NUM_ENVS.value is not None and _NUM_ENVS.value <= 0:
    raise UserError(f"--num_envs={_NUM_ENVS.value} must be a positive integer (or left out for the config's)")


def _print_plan(prof, plan, bound: dict, num_cores: int) -> None:
  """The measured stage costs, the plan resources=auto would run, and the work-conserving bound."""
  print(f"\nprofile ({prof.measured_s:.1f} s):")
  for p in prof.sim:
    print(f"  sim   threads {p['threads']:>2}  batch {p['batch']:>5}  {p['env_steps_per_s']:>10,.0f} steps/s"
          f"  {p['cpu_us_per_step']:>7.1f} us CPU/step")
  for p in prof.gen:
    print(f"  gen   batch {p['batch']:>5}  {p['wall_us']:>9.1f} us/call  {p['cpu_us']:>9.1f} us CPU/call")
  for p in prof.train:
    print(f"  train {p['samples']:>7} samples  {p['wall_s'] * 1e3:>8.1f} ms/update  {p['cpu_s'] * 1e3:>8.1f} ms CPU")
  for p in prof.assemble:
    print(f"  assemble batch {p['batch']:>5}  {p['cpu_us']:>8.1f} us/batch")
  for p in prof.render or ():
    print(f"  render batch {p['batch']:>5}  {p['wall_us'] / 1e3:>8.2f} ms/draw  {p['cpu_us'] / 1e3:>8.2f} ms CPU")
  print("\nplan:")
  for stage, cores in plan.cpu_sets.items():
    print(f"  {stage:<9} cores {list(cores)}  cost {plan.stage_cost_us[stage]:7.1f} us/step  "
          f"rate {plan.predicted_rates[stage]:>10,.0f} steps/s")
  print(f"  groups {plan.num_groups}, recv batch {plan.recv_batch}, gen batch {plan.max_gen_batch}, "
        f"EnvPool threads/pool {plan.sim_threads}, affinity offset {plan.thread_affinity_offset}")
  print(f"  predicted {plan.predicted_env_steps_per_s:,.0f} env steps/s; bottleneck {plan.bottleneck}")
  print(f"  work-conserving bound {bound['env_steps_per_s']:,.0f} env steps/s "
        f"({bound['cpu_us_per_step']:.1f} us CPU/step on {num_cores} cores)")
  for note in plan.notes:
    print(f"  {note}")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> and --config.<key>=<value> flags")
  _check_flags()
  common.enable_compilation_cache()
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import validation
  from ebrl.errors import UserError
  from ebrl.resources import planner, profiler
  from ebrl.resources.inventory import take_inventory
  from ebrl.resources.manager import gpu_note
  from ebrl.telemetry.writers import write_json
  from sim_adapters import is_device_env

  cfg = common.config_value(_CONFIG)
  cfg.env.name, cfg.policy.name, cfg.scheduler = _ENV.value, _POLICY.value, "ebrl"
  if _NUM_ENVS.value is not None:
    cfg.num_envs = _NUM_ENVS.value
  validation.validate(cfg, jax.local_device_count())
  if is_device_env(cfg.env.name):
    raise UserError(f"env '{cfg.env.name}' is a device simulator; launch.profile plans host env stages "
                    "(MetaWorld/..., EnvPool ids)")
  common.check_output_file("out", _OUT.value)  # An unwritable --out would lose every measurement.
  inv = take_inventory()
  for line in inv.summary_lines():
    print(line)
  prof = profiler.measure(cfg, inv, full=True, seconds=_SECONDS.value)
  shape = planner.RunShape.from_config(cfg)
  plan = planner.plan_auto(prof, inv.cpu_cores, shape, (gpu_note(inv),))
  bound = planner.work_conserving_bound(prof, inv.cpu_cores, shape)

  _print_plan(prof, plan, bound, len(inv.cpu_cores))
  write_json(_OUT.value, {"profile": prof.to_dict(), "plan": plan.to_dict(), "bound": bound,
                          "bottleneck": plan.bottleneck, "inventory": inv.to_dict()})
  print(f"written {_OUT.value}")


def cli() -> None:
  """The `ebrl-profile` console command (pyproject.toml): the same flags as `python -m launch.profile`."""
  common.run(main)


if __name__ == "__main__":
  cli()

"""Side-by-side throughput benchmark: every named scheduler, same envs, same cores, one run.

  python -m launch.bench --env=MetaWorld/Reach-v3 --policy=mlp \
      --schedulers=random,sync --seconds=30 --out=bench.json

Each scheduler runs in turn on a fresh adapter and learner built from the same
config. Its first `--warmup_updates` updates (compiles, first resets) are not
timed; then it runs for `--seconds`. Reported per scheduler:
`e2e_env_steps_per_s` (env steps / timed wall, training included),
`rollout_env_steps_per_s` (env steps / wall not spent waiting on training; for
schedulers whose training overlaps the rollout, the e2e rate),
`stage_busy` (fraction of the window each stage was busy), `staleness_mean`,
and the CPU the whole process used: `cpu_cores_used` (CPU seconds per wall
second, every thread included: simulator, sampler, learner, XLA) and
`cpu_us_per_env_step`. From them, `work_conserving_env_steps_per_s` is the rate
this scheduler's own work per step would reach with every usable core busy all
the time: no schedule doing that work can beat it on this machine, so
`work_conserving / e2e` bounds what overlapping stages can still gain.
`force_started` and `stale_dropped` (from the run's summary) count the
generation batches started before they were full and the samples dropped as
too stale. `ratios` compares schedulers as A_over_B for every pair that ran.

Every flag is checked, and every output path proved writable, before the first
scheduler runs: a bad value found later would cost the runs before it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

from absl import flags

from launch import common

_ENV = flags.DEFINE_string("env", "MetaWorld/Reach-v3", "Env name.")
_POLICY = flags.DEFINE_string("policy", "mlp", "Policy name.")
_SCHEDULERS = flags.DEFINE_list("schedulers", ["random", "sync"], "Schedulers to compare, in run order.")
_SECONDS = flags.DEFINE_float("seconds", 30.0, "Timed seconds per scheduler.")
_WARMUP = flags.DEFINE_integer("warmup_updates", 3, "Untimed updates before the window opens.")
_NUM_ENVS = flags.DEFINE_integer("num_envs", None, "Envs (default: the config's).")
_OUT = flags.DEFINE_string("out", "bench.json", "Where to write the JSON results.")
_STRAGGLER_FRACTION = flags.DEFINE_float("straggler_fraction", 0.0, "Fraction of envs made slow.")
_STRAGGLER_SLOWDOWN = flags.DEFINE_float("straggler_slowdown", 1.0, "How many times longer a slow env's step takes.")
_RESOURCES = flags.DEFINE_list(
    "resources", [], "Resource modes to run the ebrl scheduler under, each as its own entry "
    "'ebrl+<mode>' (e.g. naive,auto); empty = the config's resources only.")
_TIMELINE = flags.DEFINE_string("timeline", None, "PNG with every scheduler's stage timeline (default: beside --out).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Keep each scheduler's run outputs (summary.json, metrics.jsonl, "
                               "trace.json) in <workdir>/<scheduler> (default: a temporary directory, removed).")
_CONFIG = common.define_config(help_text="Base run config; --config.<key>=<value> overrides apply to every scheduler.")

# Ratios worth reporting, as (numerator, denominator), when both ran.
_RATIO_PAIRS = (("sync", "random"), ("ebrl", "sync"), ("ebrl", "pipelined"), ("ebrl", "random"),
                ("pipelined", "sync"), ("ebrl+auto", "ebrl+naive"), ("ebrl+auto", "sync"),
                ("ebrl+auto", "random"))


def _ratio_name(a: str, b: str) -> str:
  """"ebrl_over_sync"; two resource modes of ebrl compare by mode alone: "auto_over_naive"."""
  if a.startswith("ebrl+") and b.startswith("ebrl+"):
    a, b = a[len("ebrl+"):], b[len("ebrl+"):]
  return f"{a}_over_{b}"


class _Window:
  """Opens the timed window after the warm-up updates and closes it at the deadline."""

  def __init__(self, warmup: int, seconds: float):
    self.warmup, self.seconds, self.updates = warmup, seconds, 0
    self.start = None

  def __call__(self, trainer) -> None:
    self.updates += 1
    if self.updates == self.warmup:
      self.start = _mark(trainer)
      trainer.deadline = time.time() + self.seconds

  def result(self, trainer, end: tuple) -> dict:
    t0, s0, c0, cpu0 = self.start
    t1, s1, c1, cpu1 = end
    wall = t1 - t0
    busy = {k: (c1[k] - c0.get(k, 0.0)) / wall for k in ("sim", "render", "gen", "train") if k in c1}
    steps = s1 - s0
    cores = (cpu1 - cpu0) / wall
    us_per_step = (cpu1 - cpu0) * 1e6 / max(steps, 1)
    return {"env_steps": steps, "window_s": wall, "e2e_env_steps_per_s": steps / wall,
            "rollout_env_steps_per_s": steps / max(wall * (1.0 - busy["train"]), 1e-9),
            "stage_busy": busy, "staleness_mean": trainer.staleness_mean(),
            "cpu_cores_used": cores, "cpu_us_per_env_step": us_per_step,
            "work_conserving_env_steps_per_s": len(os.sched_getaffinity(0)) * 1e6 / max(us_per_step, 1e-9)}


def _mark(trainer) -> tuple:
  """(wall, env steps, stage clock, process CPU seconds) at this moment."""
  cpu = os.times()
  return (time.perf_counter(), trainer.env_steps, trainer.clock.snapshot(), cpu.user + cpu.system)


def _entry_config(entry: str, base_cfg):
  """'ebrl+naive' -> the ebrl scheduler under resources=naive; a plain name -> that scheduler."""
  cfg = base_cfg.copy_and_resolve_references()
  cfg.scheduler, _, mode = entry.partition("+")
  if mode:
    cfg.resources = mode
  return cfg


def run_one(name: str, base_cfg, workdir: str) -> dict:
  from ebrl.scheduler import make_scheduler  # pylint: disable=g-import-not-at-top
  from ebrl.trainer import Trainer

  cfg = _entry_config(name, base_cfg)
  cfg.total_env_steps = 10**12  # The window's deadline ends the run.
  cfg.checkpoint_every_s = 1e9
  trainer = Trainer(cfg, workdir, progress=False)
  window = _Window(_WARMUP.value, _SECONDS.value)
  trainer.update_hooks.append(window)
  scheduler = make_scheduler(cfg.scheduler, trainer.run_context())
  scheduler.run(trainer.state, cfg.total_env_steps)  # Each update's state reaches the trainer.
  end = _mark(trainer)
  if window.start is None:
    raise RuntimeError(f"scheduler {name} ended before its warm-up finished")
  result = window.result(trainer, end)
  if getattr(scheduler, "overlaps_training", False):
    result["rollout_env_steps_per_s"] = result["e2e_env_steps_per_s"]
  if trainer.resources is not None:
    plan = trainer.resources.plan
    result["resources"] = {"mode": plan.mode, "plan": plan.to_dict(),
                           "predicted_env_steps_per_s": plan.predicted_env_steps_per_s,
                           "replans": trainer.resources.controller.replans if trainer.resources.controller else 0,
                           "bound": trainer.resources.bound}
  summary = trainer.finish()
  result["force_started"] = int(summary.get("force_started", 0))
  result["stale_dropped"] = int(summary.get("stale_dropped", 0))
  result["_spans"] = trainer.tracer.spans()
  return result


def _check_window_flags() -> None:
  """A window that never opens (--warmup_updates < 1) or never closes (--seconds nan or inf)
  would run forever; --num_envs=0 would be taken for "the config's"."""
  from ebrl.errors import UserError  # pylint: disable=g-import-not-at-top

  seconds, warmup, num_envs = _SECONDS.value, _WARMUP.value, _NUM_ENVS.value
  if not math.isfinite(seconds) or seconds <= 0:
    raise UserError(f"--seconds={seconds} must be a finite number > 0 (timed seconds per scheduler)")
  if warmup < 1:
    raise UserError(f"--warmup_updates={warmup} must be an integer >= 1 (the window opens after that update)")
  if num_envs is not None and num_envs <= 0:
    raise UserError(f"--num_envs={num_envs} must be a positive integer (or left out for the config's)")
  fraction, slowdown = _STRAGGLER_FRACTION.value, _STRAGGLER_SLOWDOWN.value
  if not 0.0 <= fraction <= 1.0:
    raise UserError(f"--straggler_fraction={fraction} must be in [0, 1]")
  if not 1.0 <= slowdown < math.inf:
    raise UserError(f"--straggler_slowdown={slowdown} must be a finite number >= 1")


def _check_entry_flags() -> None:
  """--schedulers and --resources name each entry once; results are keyed by entry."""
  from ebrl import validation  # pylint: disable=g-import-not-at-top
  from ebrl.errors import UserError

  if not _SCHEDULERS.value:
    raise UserError(f"--schedulers is empty; name at least one of {', '.join(validation.SCHEDULERS)}")
  for name in _SCHEDULERS.value:
    if name not in validation.SCHEDULERS:
      raise UserError(f"unknown scheduler '{name}'; valid: {', '.join(validation.SCHEDULERS)}")
  for mode in _RESOURCES.value:
    if mode not in validation.RESOURCE_MODES:
      raise UserError(f"unknown --resources mode '{mode}'; valid: {', '.join(validation.RESOURCE_MODES)}")
  for flag, values in (("schedulers", _SCHEDULERS.value), ("resources", _RESOURCES.value)):
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
      raise UserError(f"--{flag} names {', '.join(twice)} more than once; each runs once")
  if _RESOURCES.value and "ebrl" not in _SCHEDULERS.value:
    raise UserError("--resources runs the ebrl scheduler under each mode; add ebrl to --schedulers")


def _timeline_path() -> str:
  return _TIMELINE.value or os.path.splitext(_OUT.value)[0] + "_timeline.png"


def _check_outputs(entries: list[str]) -> None:
  """Results are written after every run; a path that cannot take them must fail first.

  A kept run directory must be new: a run started in an earlier bench's directory
  would checkpoint beside that run's checkpoints.
  """
  from ebrl import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  from ebrl.errors import UserError

  common.check_output_file("out", _OUT.value)
  common.check_output_file("timeline", _timeline_path())
  if _WORKDIR.value:
    workdir_lib.check_writable(_WORKDIR.value)
    used = [e for e in entries if os.path.exists(os.path.join(_WORKDIR.value, e))]
    if used:
      raise UserError(f"--workdir={_WORKDIR.value} already holds runs of {', '.join(used)}; "
                      "pass --workdir=<a new directory>")


def _base_config():
  """The run config every scheduler starts from: the config file, then the bench's flags."""
  base = common.config_value(_CONFIG)
  base.env.name = _ENV.value
  base.policy.name = _POLICY.value
  if _NUM_ENVS.value is not None:
    base.num_envs = _NUM_ENVS.value
  base.env.straggler_fraction = _STRAGGLER_FRACTION.value
  base.env.straggler_slowdown = _STRAGGLER_SLOWDOWN.value
  return base


def _entries() -> list[str]:
  """Run order: each scheduler once; ebrl once per --resources mode when modes are given."""
  return [e for name in _SCHEDULERS.value
          for e in ([f"ebrl+{m}" for m in _RESOURCES.value] if name == "ebrl" and _RESOURCES.value else [name])]


def _run_all(entries: list[str], base) -> dict:
  """Each entry in turn, in <--workdir>/<entry> or a temporary directory removed afterwards."""
  results = {}
  with tempfile.TemporaryDirectory(prefix="ebrl-bench-") as tmp:
    root = _WORKDIR.value or tmp
    for name in entries:
      print(f"[bench] {name}: warm-up, then {_SECONDS.value:g} s timed", flush=True)
      results[name] = run_one(name, base, os.path.join(root, name))
  return results


def _report(results: dict, base) -> dict:
  """bench.json: the results, the ratios between schedulers and the share of the bound each reached."""
  ratios = {_ratio_name(a, b): results[a]["e2e_env_steps_per_s"] / results[b]["e2e_env_steps_per_s"]
            for a, b in _RATIO_PAIRS if a in results and b in results}
  bound = next((r["resources"]["bound"] for r in results.values() if r.get("resources", {}).get("bound")), None)
  out_bound = None
  if bound:
    out_bound = {"env_steps_per_s": bound["env_steps_per_s"], "cpu_us_per_step": bound["cpu_us_per_step"],
                 "fraction": {n: r["e2e_env_steps_per_s"] / bound["env_steps_per_s"] for n, r in results.items()}}
  return {"env": _ENV.value, "policy": _POLICY.value, "num_envs": base.num_envs, "seconds": _SECONDS.value,
          "stragglers": {"fraction": _STRAGGLER_FRACTION.value, "slowdown": _STRAGGLER_SLOWDOWN.value},
          "machine": common.machine_info(), "results": results, "ratios": ratios, "bound": out_bound}


def _print_table(out: dict) -> None:
  """One row per scheduler; `forced` and `stale` are its force_started and stale_dropped counts."""
  results = out["results"]
  stages = [s for s in ("sim", "render", "gen", "train") if any(s in r["stage_busy"] for r in results.values())]
  print(f"\n{'scheduler':<12}{'e2e steps/s':>14}{'rollout steps/s':>18}" + "".join(f"{s:>7}" for s in stages)
        + f"{'cores':>7}{'us/step':>9}{'bound':>12}{'forced':>8}{'stale':>7}")
  for name, r in results.items():
    b = r["stage_busy"]
    print(f"{name:<12}{r['e2e_env_steps_per_s']:>14,.0f}{r['rollout_env_steps_per_s']:>18,.0f}"
          + "".join(f"{b.get(s, 0.0):>7.2f}" for s in stages)
          + f"{r['cpu_cores_used']:>7.2f}{r['cpu_us_per_env_step']:>9.1f}"
          + f"{r['work_conserving_env_steps_per_s']:>12,.0f}{r['force_started']:>8}{r['stale_dropped']:>7}")
  for name, r in results.items():
    if r.get("resources"):
      pred = r["resources"]["predicted_env_steps_per_s"]
      print(f"{name}: predicted {pred:,.0f} env steps/s, measured/predicted "
            f"{r['e2e_env_steps_per_s'] / pred:.3f}, re-plans {r['resources']['replans']}")
  if out["bound"]:
    print(f"work-conserving bound {out['bound']['env_steps_per_s']:,.0f} env steps/s; fraction reached: "
          + ", ".join(f"{n} {f:.3f}" for n, f in out["bound"]["fraction"].items()))
  for k, v in out["ratios"].items():
    print(f"{k} = {v:.3f}")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    common.fail(f"unexpected arguments {argv[1:]}; use --<flag>=<value> and --config.<key>=<value> flags")
  _check_window_flags()
  _check_entry_flags()
  entries = _entries()
  base = _base_config()
  common.enable_compilation_cache()
  from ebrl import validation  # pylint: disable=g-import-not-at-top
  import jax
  for name in entries:  # Every scheduler's config, before anything runs.
    validation.validate(_entry_config(name, base), jax.local_device_count())
  _check_outputs(entries)  # Last: it makes directories, which a bad flag should not leave behind.

  results = _run_all(entries, base)
  spans = {name: r.pop("_spans") for name, r in results.items()}
  from ebrl.telemetry import plots  # pylint: disable=g-import-not-at-top
  plots.timelines(spans, _timeline_path())
  out = _report(results, base)
  with open(_OUT.value, "w") as f:
    json.dump(out, f, indent=2)
  _print_table(out)
  print(f"written {_OUT.value} and {_timeline_path()}")


def cli() -> None:
  """The `ebrl-bench` console command (pyproject.toml): the same flags as `python -m launch.bench`."""
  common.run(main)


if __name__ == "__main__":
  cli()

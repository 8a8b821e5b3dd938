"""Side-by-side throughput benchmark: every named scheduler, same envs, same cores, one run.

Each scheduler runs in turn on a fresh adapter and learner built from the same
config. Its first `warmup_updates` updates (compiles, first resets) are not
timed, nor, for a run that probes overlap against a barrier (resources=auto on
a fully batched plan or a device simulator), its first probe: like the stage
profile taken before the first update, it is start-up calibration, and on
MetaWorld/MT10 with 160 envs it outlasts a 10 s window (`probe_s` records how
long it took); then it runs for `seconds`. Reported per scheduler:
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

Why one process runs them all in turn: ratios are only meaningful measured on
the same machine in the same minutes. `ebrl.bench` and `python -m launch.bench`
both call `run_bench`; every value is checked, and every output path proved
writable, before the first scheduler runs: a bad value found later would cost
the runs before it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import threading
import time
from typing import Callable, Sequence

from ebrl import validation
from ebrl import workdir as workdir_lib
from ebrl.errors import UserError
from ebrl.spec import RunSpec

# Ratios worth reporting, as (numerator, denominator), when both ran.
_RATIO_PAIRS = (("sync", "random"), ("ebrl", "sync"), ("ebrl", "pipelined"), ("ebrl", "random"),
                ("pipelined", "sync"), ("ebrl+auto", "ebrl+naive"), ("ebrl+auto", "sync"),
                ("ebrl+auto", "random"))


@dataclasses.dataclass(frozen=True)
class BenchSpec:
  """What to compare and for how long; the names are `ebrl.bench`'s parameters and the CLI's flags."""
  env: str = "MetaWorld/Reach-v3"
  policy: str = "mlp"
  schedulers: Sequence[str] = ("random", "sync")
  seconds: float = 30.0
  warmup_updates: int = 3
  num_envs: int | None = None
  resources: Sequence[str] = ()  # Resource modes of the ebrl scheduler, each its own entry 'ebrl+<mode>'.
  placements: Sequence[str] = ()  # Placements of the ebrl learner, each its own entry 'ebrl[+<mode>]@<placement>'.
  rounds: int = 1  # Every entry runs this many times, interleaved (A B A B): drift hits all alike.
  straggler_fraction: float = 0.0
  straggler_slowdown: float = 1.0
  out: str | None = None  # bench.json; None: not written.
  timeline: str | None = None  # Stage timelines PNG; None: beside `out` (none without `out`).
  workdir: str | None = None  # Keep each entry's run in <workdir>/<entry>; None: a temporary directory.

  @property
  def timeline_path(self) -> str | None:
    if self.timeline:
      return self.timeline
    return os.path.splitext(self.out)[0] + "_timeline.png" if self.out else None

  def entries(self) -> list[str]:
    """Run order: each scheduler once; ebrl once per resource mode when modes are given."""
    ebrl = [f"ebrl+{m}" for m in self.resources] or ["ebrl"]
    ebrl = [f"{e}@{p}" for e in ebrl for p in self.placements] or ebrl
    return [e for name in self.schedulers for e in (ebrl if name == "ebrl" else [name])]

  def check(self) -> None:
    """A window that never opens (warmup_updates < 1) or never closes (seconds nan or inf) would run
    forever; num_envs=0 would be taken for "the config's"; results are keyed by entry."""
    seconds, warmup, num_envs = self.seconds, self.warmup_updates, self.num_envs
    if not math.isfinite(seconds) or seconds <= 0:
      raise UserError(f"seconds={seconds} must be a finite number > 0 (timed seconds per scheduler)")
    if warmup < 1:
      raise UserError(f"warmup_updates={warmup} must be an integer >= 1 (the window opens after that update)")
    if not isinstance(self.rounds, int) or self.rounds < 1:
      raise UserError(f"rounds={self.rounds} must be an integer >= 1 (timed runs of every entry, interleaved)")
    if num_envs is not None and num_envs <= 0:
      raise UserError(f"num_envs={num_envs} must be a positive integer (or left out for the config's)")
    if not 0.0 <= self.straggler_fraction <= 1.0:
      raise UserError(f"straggler_fraction={self.straggler_fraction} must be in [0, 1]")
    if not 1.0 <= self.straggler_slowdown < math.inf:
      raise UserError(f"straggler_slowdown={self.straggler_slowdown} must be a finite number >= 1")
    if not self.schedulers:
      raise UserError(f"schedulers is empty; name at least one of {', '.join(validation.SCHEDULERS)}")
    for name in self.schedulers:
      if name not in validation.SCHEDULERS:
        raise UserError(f"unknown scheduler '{name}'; valid: {', '.join(validation.SCHEDULERS)}")
    for mode in self.resources:
      if mode not in validation.RESOURCE_MODES:
        raise UserError(f"unknown resources mode '{mode}'; valid: {', '.join(validation.RESOURCE_MODES)}")
    for placement in self.placements:
      if placement not in validation.PLACEMENTS:
        raise UserError(f"unknown placement '{placement}'; valid: {', '.join(validation.PLACEMENTS)}")
    for what, values in (("schedulers", list(self.schedulers)), ("resources", list(self.resources)),
                         ("placements", list(self.placements))):
      twice = sorted({v for v in values if values.count(v) > 1})
      if twice:
        raise UserError(f"{what} names {', '.join(twice)} more than once; each runs once")
    if self.resources and "ebrl" not in self.schedulers:
      raise UserError("resources runs the ebrl scheduler under each mode; add ebrl to schedulers")
    if self.placements and "ebrl" not in self.schedulers:
      raise UserError("placements runs the ebrl scheduler under each placement; add ebrl to schedulers")

  def check_outputs(self) -> None:
    """Results are written after every run; a path that cannot take them must fail first. A kept run
    directory must be new: a run started in an earlier bench's directory would checkpoint beside
    that run's checkpoints. Last of the checks: it makes directories, which a bad value should not
    leave behind."""
    for name, path in (("out", self.out), ("timeline", self.timeline_path)):
      if path:
        workdir_lib.check_output_file(name, path)
    if self.workdir:
      workdir_lib.check_writable(self.workdir)
      used = [e for e in self.entries() if os.path.exists(os.path.join(self.workdir, e))]
      if used:
        raise UserError(f"workdir={self.workdir} already holds runs of {', '.join(used)}; "
                        "pass workdir=<a new directory>")

  def base_config(self, cfg):
    """The run config every scheduler starts from: `cfg` with this bench's env, policy and envs."""
    base = cfg.copy_and_resolve_references()
    base.env.name, base.policy.name = self.env, self.policy
    if self.num_envs is not None:
      base.num_envs = self.num_envs
    base.env.straggler_fraction = self.straggler_fraction
    base.env.straggler_slowdown = self.straggler_slowdown
    return base


def _ratio_pairs(entries) -> list[tuple[str, str]]:
  """The fixed pairs that ran, then every placement entry against sync, and two placements of one
  resource mode against each other."""
  pairs = [(a, b) for a, b in _RATIO_PAIRS if a in entries and b in entries]
  placed = [e for e in entries if "@" in e]
  pairs += [(e, "sync") for e in placed if "sync" in entries]
  pairs += [(a, b) for i, a in enumerate(placed) for b in placed[i + 1:]
            if a.partition("@")[0] == b.partition("@")[0]]
  return [(a, b) if not (a.endswith("@threads") and b.endswith("@processes")) else (b, a) for a, b in pairs]


def _ratio_name(a: str, b: str) -> str:
  """"ebrl_over_sync"; two resource modes of ebrl compare by mode alone: "auto_over_naive"; two
  placements of one mode by placement: "processes_over_threads"."""
  if "@" in a and "@" in b and a.partition("@")[0] == b.partition("@")[0]:
    return f"{a.partition('@')[2]}_over_{b.partition('@')[2]}"
  if a.startswith("ebrl+") and b.startswith("ebrl+"):
    a, b = a[len("ebrl+"):], b[len("ebrl+"):]
  return f"{a}_over_{b}"


class _Window:
  """Opens the timed window after the warm-up updates and the first overlap probe, and closes it
  `seconds` later (a timer sets the run's stop)."""

  def __init__(self, warmup: int, seconds: float):
    self.warmup, self.seconds, self.updates = warmup, seconds, 0
    self.start = None
    self.probe_s = 0.0  # From the warm-up's end to the first probe's decision.
    self._warm_at = None
    self.timer: threading.Timer | None = None

  def observe(self, trainer) -> None:
    """After each update's report."""
    self.updates += 1
    if self.start is not None or self.updates < self.warmup:
      return
    if self._warm_at is None:
      self._warm_at = time.time()
    if trainer.overlap is not None and not trainer.overlap.results:
      return
    self.probe_s = time.time() - self._warm_at
    self.start = _mark(trainer)
    self.timer = threading.Timer(self.seconds, trainer.stop_requested.set)
    self.timer.daemon = True
    self.timer.start()

  def result(self, trainer, end: tuple) -> dict:
    t0, s0, c0, cpu0, steal0 = self.start
    t1, s1, c1, cpu1, steal1 = end
    wall = t1 - t0
    busy = {k: (c1[k] - c0.get(k, 0.0)) / wall for k in ("sim", "render", "gen", "train") if k in c1}
    steps = s1 - s0
    cores = (cpu1 - cpu0) / wall
    us_per_step = (cpu1 - cpu0) * 1e6 / max(steps, 1)
    return {"env_steps": steps, "window_s": wall, "e2e_env_steps_per_s": steps / wall,
            "rollout_env_steps_per_s": steps / max(wall * (1.0 - busy["train"]), 1e-9),
            "stage_busy": busy, "staleness_mean": trainer.recorder.staleness_mean(), "probe_s": self.probe_s,
            "cpu_cores_used": cores, "cpu_us_per_env_step": us_per_step, "steal_s": steal1 - steal0,
            "work_conserving_env_steps_per_s": len(os.sched_getaffinity(0)) * 1e6 / max(us_per_step, 1e-9)}


def _mark(trainer) -> tuple:
  """(wall, env steps, stage clock, CPU seconds of the run's processes) at this moment."""
  cpu = os.times()
  child = getattr(trainer.learner, "pid", None)  # A learner process (placement=processes).
  return (time.perf_counter(), trainer.env_steps, trainer.clock.snapshot(),
          cpu.user + cpu.system + (_cpu_seconds(child) if child else 0.0), _steal_seconds())


def _steal_seconds() -> float:
  """CPU time the hypervisor gave to others while this machine's CPUs wanted it (/proc/stat
  `steal`, all CPUs): a window with much of it ran on a slower machine than its neighbours."""
  try:
    with open("/proc/stat") as f:
      fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")
  except (OSError, IndexError, ValueError):
    return 0.0


def _cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of a live process (/proc/<pid>/stat)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except OSError:
    return 0.0
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def entry_config(entry: str, base_cfg):
  """'ebrl+naive' -> the ebrl scheduler under resources=naive; 'ebrl+auto@processes' also with
  placement=processes; a plain name -> that scheduler."""
  cfg = base_cfg.copy_and_resolve_references()
  entry, _, placement = entry.partition("@")
  cfg.scheduler, _, mode = entry.partition("+")
  if mode:
    cfg.resources = mode
  if placement:
    cfg.placement = placement
  return cfg


def entry_spec(entry: str, base_cfg) -> RunSpec:
  """An entry's run, checked and resolved: its config, timed by the bench's window, not a budget."""
  cfg = entry_config(entry, base_cfg)
  cfg.total_env_steps = 10**12  # The window's deadline ends the run.
  cfg.checkpoint_every_s = 1e9
  return validation.resolve(cfg)


def run_one(name: str, run: RunSpec, workdir: str, warmup_updates: int, seconds: float) -> dict:
  """One entry: built fresh, warmed up, timed for `seconds`; its result and its trace spans."""
  from ebrl.trainer import Trainer

  trainer = Trainer(run, workdir, progress=False)
  try:
    result = _timed_run(name, trainer, warmup_updates, seconds)
    summary = trainer.finish()
  except BaseException:
    trainer.abort()  # Its learner process, shared memory and env pools go with the failed entry.
    raise
  result["force_started"] = int(summary.get("force_started", 0))
  result["stale_dropped"] = int(summary.get("stale_dropped", 0))
  result["_spans"] = trainer.tracer.spans()
  return result


def _timed_run(name: str, trainer, warmup_updates: int, seconds: float) -> dict:
  """Runs a built entry through its warm-up and its timed window; the window's result."""
  from ebrl.scheduler import make_scheduler  # pylint: disable=g-import-not-at-top

  window = _Window(warmup_updates, seconds)
  scheduler = make_scheduler(trainer.run_spec.scheduler, trainer.run_context())
  try:
    for _ in trainer.run(scheduler=scheduler):
      window.observe(trainer)
  finally:
    if window.timer is not None:
      window.timer.cancel()
  end = _mark(trainer)
  if window.start is None:
    raise RuntimeError(f"scheduler {name} ended before its warm-up finished")
  result = window.result(trainer, end)
  if scheduler.overlaps_training:
    result["rollout_env_steps_per_s"] = result["e2e_env_steps_per_s"]
  if trainer.resources is not None:
    plan = trainer.resources.plan
    result["resources"] = {"mode": plan.mode, "plan": plan.to_dict(), "placement": trainer.stage_placement,
                           "predicted_env_steps_per_s": plan.predicted_env_steps_per_s,
                           "replans": trainer.resources.controller.replans if trainer.resources.controller else 0,
                           "bound": trainer.resources.bound}
  if trainer.overlap is not None:  # Host plans and device simulators alike.
    result.setdefault("resources", {"mode": trainer.run_spec.resources})["overlap_probes"] = [
        dataclasses.asdict(r) for r in trainer.overlap.results]
  return result


def combine_rounds(rounds: list[dict]) -> dict:
  """One entry's result over its rounds: rates as total steps over total window time, shares and
  per-step costs weighted by window, counts summed; each round's own rate kept in `rounds_e2e`."""
  if len(rounds) == 1:
    return rounds[0]
  for r in rounds:
    r.pop("_spans", None)
  wall = sum(r["window_s"] for r in rounds)
  steps = sum(r["env_steps"] for r in rounds)
  weigh = lambda key: sum(r[key] * r["window_s"] for r in rounds) / wall
  cpu_s = sum(r["cpu_cores_used"] * r["window_s"] for r in rounds)
  total = lambda key: sum(r.get(key, 0) for r in rounds)
  out = dict(rounds[-1])  # The last round's plan, probes and layout.
  out.update(env_steps=steps, window_s=wall, e2e_env_steps_per_s=steps / wall,
             rollout_env_steps_per_s=steps / sum(r["env_steps"] / r["rollout_env_steps_per_s"] for r in rounds),
             stage_busy={k: sum(r["stage_busy"][k] * r["window_s"] for r in rounds) / wall
                         for k in rounds[0]["stage_busy"]},
             staleness_mean=weigh("staleness_mean"), cpu_cores_used=cpu_s / wall,
             cpu_us_per_env_step=cpu_s * 1e6 / max(steps, 1), steal_s=total("steal_s"),
             force_started=total("force_started"), stale_dropped=total("stale_dropped"),
             rounds_e2e=[r["e2e_env_steps_per_s"] for r in rounds])
  out["work_conserving_env_steps_per_s"] = len(os.sched_getaffinity(0)) * 1e6 / max(out["cpu_us_per_env_step"], 1e-9)
  return out


def _report(spec: BenchSpec, results: dict, base, machine: dict) -> dict:
  """bench.json: the results, the ratios between schedulers and the share of the bound each reached."""
  pairs = _ratio_pairs(list(results))
  ratios = {_ratio_name(a, b): results[a]["e2e_env_steps_per_s"] / results[b]["e2e_env_steps_per_s"] for a, b in pairs}
  # Per round (the entries of one round ran next to each other): the spread the ratio has here.
  round_ratios = {_ratio_name(a, b): [x / y for x, y in zip(results[a]["rounds_e2e"], results[b]["rounds_e2e"])]
                  for a, b in pairs if "rounds_e2e" in results[a] and "rounds_e2e" in results[b]}
  bound = next((r["resources"]["bound"] for r in results.values() if r.get("resources", {}).get("bound")), None)
  out_bound = None
  if bound:
    out_bound = {"env_steps_per_s": bound["env_steps_per_s"], "cpu_us_per_step": bound["cpu_us_per_step"],
                 "fraction": {n: r["e2e_env_steps_per_s"] / bound["env_steps_per_s"] for n, r in results.items()}}
  return {"env": spec.env, "policy": spec.policy, "num_envs": base.num_envs, "seconds": spec.seconds,
          "stragglers": {"fraction": spec.straggler_fraction, "slowdown": spec.straggler_slowdown},
          "machine": machine, "rounds": spec.rounds, "results": results, "ratios": ratios,
          **({"round_ratios": round_ratios} if round_ratios else {}), "bound": out_bound}


def table_lines(out: dict) -> list[str]:
  """One row per scheduler; `forced` and `stale` are its force_started and stale_dropped counts."""
  results = out["results"]
  stages = [s for s in ("sim", "render", "gen", "train") if any(s in r["stage_busy"] for r in results.values())]
  width = max(12, 2 + max(len(n) for n in results))
  lines = [f"\n{'scheduler':<{width}}{'e2e steps/s':>14}{'rollout steps/s':>18}" + "".join(f"{s:>7}" for s in stages)
           + f"{'cores':>7}{'us/step':>9}{'bound':>12}{'forced':>8}{'stale':>7}"]
  for name, r in results.items():
    b = r["stage_busy"]
    lines.append(f"{name:<{width}}{r['e2e_env_steps_per_s']:>14,.0f}{r['rollout_env_steps_per_s']:>18,.0f}"
                 + "".join(f"{b.get(s, 0.0):>7.2f}" for s in stages)
                 + f"{r['cpu_cores_used']:>7.2f}{r['cpu_us_per_env_step']:>9.1f}"
                 + f"{r['work_conserving_env_steps_per_s']:>12,.0f}{r['force_started']:>8}{r['stale_dropped']:>7}")
  for name, r in results.items():
    if r.get("resources"):
      if "predicted_env_steps_per_s" in r["resources"]:
        pred = r["resources"]["predicted_env_steps_per_s"]
        lines.append(f"{name}: predicted {pred:,.0f} env steps/s, measured/predicted "
                     f"{r['e2e_env_steps_per_s'] / pred:.3f}, re-plans {r['resources']['replans']}")
      for probe in r["resources"].get("overlap_probes", ()):
        chosen = "overlap" if probe["admission"] else "barrier"
        lines.append(f"{name}: at {probe['t']:.1f} s, overlapped {probe['overlapped_env_steps_per_s']:,.0f} vs barrier "
                     f"{probe['barrier_env_steps_per_s']:,.0f} env steps/s -> {chosen}")
  if out["bound"]:
    lines.append(f"work-conserving bound {out['bound']['env_steps_per_s']:,.0f} env steps/s; fraction reached: "
                 + ", ".join(f"{n} {f:.3f}" for n, f in out["bound"]["fraction"].items()))
  rounds = out.get("round_ratios", {})
  lines += [f"{k} = {v:.3f}" + (f"  (rounds: {', '.join(f'{x:.3f}' for x in rounds[k])})" if k in rounds else "")
            for k, v in out["ratios"].items()]
  steal = {n: r.get("steal_s", 0.0) for n, r in results.items()}
  if any(v > 0 for v in steal.values()):
    lines.append("CPU stolen by the hypervisor in the windows: "
                 + ", ".join(f"{n} {v:.1f} s" for n, v in steal.items()))
  return lines


def run_bench(spec: BenchSpec, cfg, log: Callable[[str], None] = print) -> dict:
  """Checks everything, runs each entry in turn on `cfg` (a full run config) and returns bench.json's
  content, also written to `spec.out` (with the timelines beside it) when given."""
  import jax  # pylint: disable=g-import-not-at-top

  from ebrl import runtime
  from ebrl.resources import gpu_sharing

  spec.check()
  base = spec.base_config(cfg)
  entries = spec.entries()
  runs_of = {name: entry_spec(name, base) for name in entries}  # Every entry, before MPS or JAX's backend starts.
  wanting = [r for r in runs_of.values() if gpu_sharing.wanted(r)]
  if wanting:  # Before JAX's backend starts: MPS for an entry's learner process on a GPU.
    gpu_sharing.begin(wanting[0])
  try:
    for run in runs_of.values():  # The checks that need the device count.
      validation.check_devices(run, jax.local_device_count())
    spec.check_outputs()
  except BaseException:
    gpu_sharing.abandon()
    raise
  runtime.enable_compilation_cache()

  runs: dict[str, list[dict]] = {name: [] for name in entries}
  with tempfile.TemporaryDirectory(prefix="ebrl-bench-") as tmp:
    root = spec.workdir or tmp
    for k in range(spec.rounds):
      for name in entries:
        round_note = f" (round {k + 1} of {spec.rounds})" if spec.rounds > 1 else ""
        log(f"[bench] {name}: warm-up, then {spec.seconds:g} s timed{round_note}")
        workdir = os.path.join(root, name) if spec.rounds == 1 else os.path.join(root, name, f"round{k + 1}")
        runs[name].append(run_one(name, runs_of[name], workdir, spec.warmup_updates, spec.seconds))
  spans = {name: rs[-1].pop("_spans") for name, rs in runs.items()}
  results = {name: combine_rounds(rs) for name, rs in runs.items()}
  out = _report(spec, results, base, runtime.machine_info())
  if spec.timeline_path:
    from ebrl.telemetry import plots  # pylint: disable=g-import-not-at-top
    plots.timelines(spans, spec.timeline_path)
  if spec.out:
    with open(spec.out, "w") as f:
      json.dump(out, f, indent=2)
  for line in table_lines(out):
    log(line)
  written = [p for p in (spec.out, spec.timeline_path) if p]
  if written:
    log(f"written {' and '.join(written)}")
  return out

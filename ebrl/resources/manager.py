"""The resource manager of a run: plan before the simulators exist, enforce, re-plan on drift.

  resources=off     no manager: the ebrl.* sizes, every thread on every core (default);
  resources=auto    profile (cached per machine and shapes), plan the best
                    layout and batch sizes, pin every stage, and let the
                    controller re-plan when measured stage costs drift;
  resources=naive   equal split of the cores between sim, gen and train, the
                    config's own batch sizes, no feedback (the baseline a
                    static allocator gives);
  resources=manual  the user's quotas.* core sets and threads, no feedback.

Only the ebrl scheduler has stages on threads of their own to place; the other
schedulers keep their fixed layout.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Callable

from ebrl.resources import planner, profiler
from ebrl.resources.controller import CPU, Controller, Telemetry
from ebrl.resources.enforce import MESA_THREAD_PREFIX, Enforcer, format_cores, parse_cores
from ebrl.resources.inventory import Inventory, take_inventory
from ebrl.resources.overlap import OverlapSwitch
from ebrl.resources.plan import STAGES, Plan
from ebrl.tuning import Knobs, Mark, UpdateReport

if TYPE_CHECKING:
  from ebrl.spec import RunSpec


def manual_layout(run: RunSpec, usable: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
  """quotas.{sim,gen,train}_cores (and render_cores, optional) parsed; ValueError naming the bad one."""
  layout = {}
  render = bool(run.env.render_stage and run.quotas.render_cores)
  if run.quotas.render_cores and not run.env.render_stage:
    raise ValueError(f"quotas.render_cores='{run.quotas.render_cores}' places a render stage; "
                     "this run has none (set env.render_stage=True, or leave render_cores empty)")
  for stage in ("sim", "gen", "train") + (("render",) if render else ()):
    text = getattr(run.quotas, f"{stage}_cores")
    if not text:
      raise ValueError(f"resources=manual needs quotas.{stage}_cores (a core list like '0-3'); "
                       f"usable cores: {format_cores(usable)}")
    try:
      layout[stage] = parse_cores(text, usable)
    except ValueError as e:
      raise ValueError(f"quotas.{stage}_cores={e}") from None
  return layout


def gpu_note(inv: Inventory) -> str:
  if not inv.gpus:
    return "no GPU: CPU core pools only (no SM split to plan)"
  if inv.jax_platform != "gpu":
    return f"{len(inv.gpus)} GPU(s) but JAX runs on {inv.jax_platform}: CPU core pools only"
  how = "MPS SM shares" if inv.mps.can_start else f"whole devices ({inv.mps.reason or 'MPS unavailable'})"
  return (f"{len(inv.gpus)} GPU(s): gen and train share them by {how}; stages run as threads of one process, "
          "so SM shares apply to stage processes (launch/mps_bench.py)")


class ResourceManager:

  def __init__(self, run: RunSpec, log: Callable[[str], None] = print, inventory: Inventory | None = None):
    self.run = run
    self.log = log
    self.inventory = inventory or take_inventory()
    cores = self.inventory.cpu_cores
    self.shape = planner.RunShape.of(run)
    # The config's own layout: what naive and manual plans keep (auto chooses its own).
    base = run.layout
    groups, recv = base.num_groups, base.recv_batch
    notes = (gpu_note(self.inventory),)
    self.profile: profiler.Profile | None = None
    if run.quotas.profile:
      self.profile = profiler.load(run.quotas.profile)
    elif run.resources == "auto":
      self.profile = profiler.load_or_measure(run, self.inventory, log=log, mps_pipe_dir=_mps_pipe_dir())
    chosen = None if run.learner_placement == "auto" else run.learner_placement  # The user's, else the plan's.
    if run.resources == "auto":
      plan = planner.plan_auto(self.profile, cores, self.shape, notes, placement=chosen)
    elif run.resources == "naive":
      plan = planner.plan_naive(self.shape, cores, groups, recv, self.profile)
    else:
      plan = planner.plan_manual(self.shape, manual_layout(run, cores), groups, recv, run.quotas.sim_threads,
                                 self.profile)
    self.plan = self._with_learner_share(plan.replace(notes=notes, placement=chosen or plan.placement), self.profile)
    self.bound = (planner.work_conserving_bound(self.profile, cores, self.shape)
                  if self.profile is not None else None)
    self.enforcer = Enforcer(self.plan)
    self.learner_process = None  # A LearnerProcessPlacement that follows each plan (placement=processes).
    self.controller = None
    if run.resources == "auto" and run.quotas.control_interval_s > 0:
      self.controller = Controller(self.plan, self._replan, interval_s=run.quotas.control_interval_s,
                                   cooldown_s=3 * run.quotas.control_interval_s, floor_share=1.0)
    # Overlap or a barrier, measured on the run (overlap.py), where overlap is allowed at all and
    # the layout is fully batched: its envs step together, so a barrier parks them all at once and
    # the run becomes the sync schedule. Async groups under a barrier park envs a few at a time,
    # leave too few in flight for a recv, and need the deadlock breaker (BENCHMARKS.md: far below
    # sync on CartpoleBalance-v1). A multi-task env's task pools
    # each step their envs together and return whatever is in flight, so a barrier parks whole
    # pools and stalls none: every plan of one may be probed.
    # A tuner of its own beside this one (the driver asks both).
    self.overlap = None
    if OverlapSwitch.allowed(run) and (self.shape.multitask or planner.fully_batched(
        self.profile, self.plan.num_groups, self.plan.recv_batch)):
      self.overlap = OverlapSwitch(run.max_staleness, run.quotas.overlap_probe_s, log, barrier=self.plan.barrier)
    self._t0 = time.time()
    self._mesa_threads = 0
    for line in self.describe():
      log(line)

  # -- what it says --------------------------------------------------------------

  def describe(self) -> list[str]:
    p = self.plan
    quotas = ", ".join(f"{s} {format_cores(p.cpu_sets[s])}" for s in STAGES if s in p.cpu_sets and s != "assemble")
    lines = [f"[resources] {p.mode}: {quotas}; {p.num_groups} group(s), recv {p.recv_batch}, "
             f"gen batch {p.max_gen_batch}, {p.sim_threads} EnvPool thread(s)/pool, learner in "
             f"{'a process of its own' if p.placement == 'processes' else 'this process'}"
             + (f" with {p.learner_sm_percent}% of the SMs" if p.learner_sm_percent else "")
             + ("; rollout and updates in turn (a barrier) until the overlap probe says otherwise"
                if p.barrier else "")]
    if math.isfinite(p.predicted_env_steps_per_s):
      lines.append(f"[resources] predicted {p.predicted_env_steps_per_s:,.0f} env steps/s, "
                   f"bottleneck {p.bottleneck}")
    if self.bound:
      lines.append(f"[resources] work-conserving bound {self.bound['env_steps_per_s']:,.0f} env steps/s")
    lines += [f"[resources] {n}" for n in p.notes]
    return lines

  def metrics(self) -> dict:
    out = {"resources_predicted_env_steps_per_s": self.plan.predicted_env_steps_per_s}
    if self.controller is not None:
      out.update(self.controller.metrics())
    return out

  # -- enforcement ---------------------------------------------------------------

  def pin_stage(self, stage: str) -> None:
    self.enforcer.pin_stage(stage)

  def adopt(self, stage: str):
    return self.enforcer.adopt(stage)

  # -- feedback ------------------------------------------------------------------

  def initial(self) -> Knobs:
    return self._knobs(self.plan)

  def _knobs(self, plan: Plan, marks: tuple[Mark, ...] = ()) -> Knobs:
    """The scheduler's knobs of `plan`: its generation batch (unless the user fixed one) and wait."""
    return Knobs(max_gen_batch=None if self.run.async_.max_gen_batch else plan.max_gen_batch,
                 max_wait_s=plan.max_wait_ms / 1000.0, marks=marks)

  def decide(self, report: UpdateReport) -> Knobs | None:
    """After every update: feeds the controller the run's env steps, its stages' busy seconds and its
    CPU time; a re-plan is enforced here (cores, the learner process) and returned as knobs."""
    if self.run.env.render_stage and not self._mesa_threads:
      # Mesa's rasterizer threads appear with the first draw (on the render thread, whose cores
      # they inherit); recorded so that a re-plan moves them with it.
      self._mesa_threads = self.enforcer.pin_named("render", MESA_THREAD_PREFIX)
    if self.controller is None:
      return None
    cpu = os.times()
    tel = Telemetry(t=report.time - self._t0, env_steps=report.env_steps, cpu_s=cpu.user + cpu.system,
                    busy_s={s: report.busy_s[s] for s in ("sim", "render", "gen", "train") if s in report.busy_s})
    decision = self.controller.observe(tel)
    if decision is None:
      return None
    self.plan = decision.new_plan
    self.enforcer.apply(self.plan)
    marks = [Mark("replan", "re-plan", {"reason": decision.reason,
                                         "predicted_env_steps_per_s": self.plan.predicted_env_steps_per_s})]
    self.log(f"[resources] re-plan: {decision.reason}; now predicting "
             f"{self.plan.predicted_env_steps_per_s:,.0f} env steps/s, bottleneck {self.plan.bottleneck}")
    if self.learner_process is not None:
      marks += self.learner_process.follow(self.plan)
    return self._knobs(self.plan, tuple(marks))

  def _replan(self, measured: dict[str, float]) -> Plan:
    """Adds the measured change in CPU per env step to the stages that moved, then re-plans what
    can change while the run goes on (layout, generation batch); groups and recv batch are
    fixed by the simulators already built."""
    for stage, extra in attribute_cpu_change(self.controller.reference or {}, measured,
                                             self.controller.drift * self.controller.floor_share).items():
      self.profile = self.profile.with_extra(stage, extra)
    # What the run pays beyond the stages timed alone (thread hand-offs, per-call Python, a
    # contended cache) is now measured too: host bookkeeping, charged to "assemble".
    # The bound stays a bound of the stage costs alone.
    planning = self.profile
    if CPU in measured:
      modelled = sum(planner.stage_costs(self.profile, self.plan.num_groups, self.plan.recv_batch,
                                         self.plan.placement).values())
      if measured[CPU] > modelled:
        planning = self.profile.with_extra("assemble", measured[CPU] - modelled)
    plan = planner.plan_auto(planning, self.inventory.cpu_cores, self.shape, self.plan.notes,
                             fixed=(self.plan.num_groups, self.plan.recv_batch), placement=self.plan.placement)
    plan = plan.replace(barrier=self.plan.barrier)  # What the run started with; the probe owns the admission.
    self.bound = planner.work_conserving_bound(self.profile, self.inventory.cpu_cores, self.shape)
    return self._with_learner_share(plan, planning)

  def _with_learner_share(self, plan: Plan, profile: profiler.Profile | None) -> Plan:
    """The plan with its learner process's SM share where the profile measured shares under MPS
    (then a re-plan after a demand shift may choose another; the trainer restarts the learner
    process with it). The user's quotas.learner_sm_percent, when set, is never overridden."""
    if plan.placement != "processes" or profile is None or self.run.quotas.learner_sm_percent:
      return plan
    share = planner.learner_share(profile, self.shape, plan)
    return plan if share is None else plan.replace(learner_sm_percent=share[0])


def _mps_pipe_dir() -> str:
  """The pipe directory of the MPS daemon this process started (gpu_sharing.begin), else ""."""
  from ebrl.resources import gpu_sharing  # pylint: disable=g-import-not-at-top

  sharing = gpu_sharing.current()
  return sharing.daemon.pipe_dir if sharing is not None and sharing.mode == "mps" else ""


def attribute_cpu_change(reference: dict[str, float], measured: dict[str, float],
                         min_share: float) -> dict[str, float]:
  """Stage -> CPU µs per env step to add to its profile, from one re-plan's measurements.

  The process's change in CPU per env step (`cpu`) is the amount; the stages
  whose wall cost per step moved the same way, by at least `min_share` of the
  reference CPU per step, share it in proportion to how far each moved. Wall
  cost alone would overstate it: a stage busy waiting on a slower neighbour is
  busy longer per step at no extra CPU (a burn added to every sim step moved
  the sim stage's wall cost several times as far as its CPU cost).
  """
  if CPU not in reference or CPU not in measured:
    return {}
  change = measured[CPU] - reference[CPU]
  moved = {s: measured[s] - reference[s] for s in STAGES if s in reference and s in measured}
  floor = min_share * reference[CPU]
  same_way = {s: d for s, d in moved.items() if d * change > 0 and abs(d) >= floor}
  if not same_way:  # Nothing moved clearly: the stage that moved most, if it moved the same way.
    s = max(moved, key=lambda s: abs(moved[s]), default=None)
    same_way = {s: moved[s]} if s is not None and moved[s] * change > 0 else {}
  total = sum(same_way.values())
  return {s: change * d / total for s, d in same_way.items()} if total else {}

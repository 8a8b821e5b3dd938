"""Runtime feedback for the resource planner: re-plan when measured stage costs drift.

The planner sizes quotas and batch sizes from profiled stage costs; a run that
drifts from that profile (a slower scene, a larger network, a neighbour on the
cores) keeps a plan built for another workload. The controller watches what
the run actually pays and hands the planner fresh costs when they have moved.

It measures cost per env step (wall µs a stage was busy, per env step), not a
stage's busy fraction: busy fraction changes with throughput itself (a stage
starved by a slower neighbour looks idle, not cheaper), while cost per step is
a property of the workload and is exactly what the planner's model takes.

It acts with hysteresis, because a controller that re-plans on every noisy
window thrashes quotas and batch sizes, and no re-plan is free (threads are
re-pinned, new batch shapes may compile):
  smoothing   an EMA over windows, so single-window noise does not count;
  dwell       drift must persist for several consecutive windows;
  cooldown    a minimum time between re-plans (and after the start), which
              bounds the re-plan rate even against an adversarial signal;
  re-anchor   after a re-plan the measured costs are the reference and the
              EMA restarts from them, so a step change re-plans once instead
              of over and over while the EMA catches up.

What it compares with. Not the plan's own costs: stage clocks measure *wall*
µs a stage's thread was busy per env step, which is not the profile's CPU µs
(a recv waits for EnvPool's workers; a sampler call waits for XLA's threads),
so a run would look drifted from its first window. The controller therefore
takes the mean of the first `dwell` full windows under a plan as the
reference and watches for drift from it; a re-plan hands on the measured
costs, which the caller compares with that reference (same clocks, same
units), never with the profile.

Pure logic: no threads, no clocks, no JAX; the caller feeds Telemetry.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ebrl.resources.plan import STAGES, Plan

KIND_REPLAN = "replan"
CPU = "cpu"  # Not a stage: the process's CPU µs per env step, measured next to the stages.


@dataclasses.dataclass(frozen=True)
class Telemetry:
  """One cumulative snapshot of the run; the controller works on deltas between them."""
  t: float  # Seconds since run start.
  env_steps: int  # Cumulative.
  cpu_s: float  # Cumulative process CPU seconds.
  busy_s: dict[str, float]  # Stage -> cumulative wall seconds busy ("assemble" may be missing).


@dataclasses.dataclass(frozen=True)
class Decision:
  t: float
  kind: str
  reason: str  # One sentence: the stage, planned and measured cost per step, the drift.
  old_plan: Plan
  new_plan: Plan
  measured_cost_us: dict[str, float]  # What the planner was given, µs per env step.
  reference_cost_us: dict[str, float] = dataclasses.field(default_factory=dict)  # What it drifted from.


class Controller:
  """Compares measured stage costs per env step with the first windows', and re-plans on drift.

  `replan` gets every stage of the reference ("cpu" too) with its measured µs
  per env step (its smoothed value where the drifting windows lack it) and
  returns the new Plan. Stages never measured are not in the reference.
  """

  def __init__(self, plan: Plan, replan: Callable[[dict[str, float]], Plan], *,
               interval_s: float = 5.0, drift: float = 0.25, dwell: int = 2,
               cooldown_s: float = 15.0, smoothing: float = 0.5, min_steps: int = 1000,
               floor_share: float = 0.0):
    if not 0.0 < smoothing <= 1.0:
      raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
    self.plan = plan
    # Stage -> µs per env step that counts as "as planned": None until the first `dwell` full
    # windows have measured it; a re-plan re-anchors it to what it planned with.
    self.reference: dict[str, float] | None = None
    self._settling: list[dict[str, float]] = []
    self.replan = replan
    self.interval_s = interval_s
    self.drift = drift
    self.dwell = max(1, dwell)
    self.cooldown_s = cooldown_s
    self.smoothing = smoothing
    self.min_steps = min_steps
    self.floor_share = floor_share
    self.decisions: list[Decision] = []
    self.replans = 0
    self.last_measured_cost_us: dict[str, float] = {}  # The last window, unsmoothed ("cpu" too).
    self._anchor: Telemetry | None = None  # Start of the current window.
    self._ema: dict[str, float] = {}
    self._streak: list[dict[str, float]] = []  # Raw costs of the latest drifting windows.
    per_cooldown = int(cooldown_s / interval_s) if interval_s > 0 else 0
    self._streak_max = max(self.dwell, per_cooldown) + 1  # Windows the estimate averages, at most.
    self._drift_windows = 0  # Consecutive drifting windows (the streak is capped; this is not).
    self._last_replan_t: float | None = None  # Or the first observation's t.

  # -- windows -------------------------------------------------------------------

  def observe(self, tel: Telemetry) -> Decision | None:
    """Feed a snapshot (cheap; call every update). Returns a Decision when it re-planned."""
    if self._anchor is None:
      self._anchor, self._last_replan_t = tel, tel.t
      return None
    a = self._anchor
    if tel.t < a.t or tel.env_steps < a.env_steps:  # A restarted counter: start over.
      self._anchor = tel
      return None
    if tel.t - a.t < self.interval_s:
      return None
    self._anchor = tel
    steps = tel.env_steps - a.env_steps
    if steps < self.min_steps:
      # Too few steps to divide by; a stalled window measures a pause, not a cost.
      return None
    cost = {s: (tel.busy_s[s] - a.busy_s[s]) / steps * 1e6
            for s in tel.busy_s if s in a.busy_s}
    cost[CPU] = (tel.cpu_s - a.cpu_s) / steps * 1e6
    self.last_measured_cost_us = cost
    if self.reference is None:  # The first full windows set it.
      self._settling.append(cost)
      if len(self._settling) >= self.dwell:
        self.reference = {s: sum(c[s] for c in self._settling if s in c) / len(self._settling)
                          for s in self._settling[-1]}
        self._ema = dict(self.reference)
      return None
    w = self.smoothing
    for s, v in cost.items():
      self._ema[s] = w * v + (1.0 - w) * self._ema[s] if s in self._ema else v
    if not self._drifting():
      self._streak, self._drift_windows = [], 0
      return None
    self._streak = (self._streak + [cost])[-self._streak_max:]
    self._drift_windows += 1
    if self._drift_windows < self.dwell or tel.t - self._last_replan_t < self.cooldown_s:
      return None
    measured = self._estimate()
    if not any(abs(d) > self.drift for d in self._deviations(measured).values()):
      # The EMA crossed the line but the streak averages back inside it (a signal
      # oscillating around the threshold): nothing to plan for yet.
      return None
    return self._replan(tel.t, measured)

  def _deviations(self, cost: dict[str, float] | None = None) -> dict[str, float]:
    """Stage -> change / max(reference, floor_share x reference CPU) (smoothed by default),
    for referenced and measured stages; plain measured / reference - 1 without a floor."""
    cost = self._ema if cost is None else cost
    ref = self.reference or {}
    floor = self.floor_share * ref.get(CPU, 0.0)
    return {s: (cost[s] - p) / (p if s == CPU else max(p, floor)) for s, p in ref.items()
            if p > 0 and s in cost}

  def _drifting(self) -> bool:
    return any(abs(d) > self.drift for d in self._deviations().values())

  def _estimate(self) -> dict[str, float]:
    """Measured cost of every referenced stage: the mean over the latest drifting windows.

    The EMA lags a step change (two windows at weight 0.5 reach only 3/4 of it),
    while every window of the streak already belongs to the new regime, so their
    plain mean is the better estimate to plan with. The streak keeps the last
    few windows only, so a persistent oscillation costs bounded memory.
    """
    out = {}
    for s, ref in (self.reference or {}).items():
      vals = [w[s] for w in self._streak if s in w]
      out[s] = sum(vals) / len(vals) if vals else self._ema.get(s, ref)
    return out

  def _replan(self, t: float, measured: dict[str, float]) -> Decision:
    old, dev, n = self.plan, self._deviations(measured), self._drift_windows
    reference = dict(self.reference or {})
    new = self.replan(dict(measured))
    decision = Decision(t=t, kind=KIND_REPLAN, reason=_reason(reference, measured, dev, self.drift, n),
                        old_plan=old, new_plan=new, measured_cost_us=measured, reference_cost_us=reference)
    self.plan = new
    self.replans += 1
    self.decisions.append(decision)
    self._last_replan_t = t
    self._streak, self._drift_windows = [], 0
    self._ema.update({s: v for s, v in measured.items() if s in self._ema})  # Re-anchor.
    self.reference = {**reference, **measured}
    return decision

  # -- logging -------------------------------------------------------------------

  def metrics(self) -> dict[str, float | str]:
    """Flat fields for the periodic metrics row: the plan in force and the last window."""
    out: dict[str, float | str] = {
        "controller_replans": float(self.replans),
        "controller_predicted_env_steps_per_s": float(self.plan.predicted_env_steps_per_s),
        "controller_bottleneck": self.plan.bottleneck,
    }
    dev = self._deviations()
    if dev:
      out["controller_drift"] = max(abs(d) for d in dev.values())
    for s in sorted(self.last_measured_cost_us, key=_stage_order):
      key = "controller_cpu_us_per_step" if s == CPU else f"controller_measured_{s}_us"
      out[key] = float(self.last_measured_cost_us[s])
    return out


def _stage_order(s: str) -> tuple[int, str]:
  return (STAGES.index(s) if s in STAGES else len(STAGES), s)


def _reason(reference: dict[str, float], measured: dict[str, float], dev: dict[str, float], drift: float,
            windows: int) -> str:
  """"sim cost 232 us/step vs 116 planned (+100%) for 2 windows", plus other drifting stages."""
  ranked = sorted(dev, key=lambda s: -abs(dev[s]))
  def part(s: str) -> str:
    p = reference[s]
    what = "process CPU" if s == CPU else f"{s} cost"
    return f"{what} {measured[s]:.0f} us/step vs {p:.0f} planned ({measured[s] / p - 1.0:+.0%})"
  head = f"{part(ranked[0])} for {windows} window{'s' if windows != 1 else ''}"
  others = [part(s) for s in ranked[1:] if abs(dev[s]) > drift]
  return head + ("; also " + ", ".join(others) if others else "")
